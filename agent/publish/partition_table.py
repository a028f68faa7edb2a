"""Derive the `gpu-partitions` table and the `gpu-partition-policy` label from the discovered topology.

Koordinator needs the table written by hand (or by a vendor file); we compute it from the node's
interconnect matrix (`apis.interconnect`, the same one the allocator chooses GPU sets by). From the
largest size down (the node's full count, then the powers of two below it), each group of the
size above is cut into the best-connected disjoint groups of this size: the grouping whose weakest
group has the best bottleneck pair, then the best total (`best_groups`; ties follow locality order:
NVLink domain, NUMA node, PCIe switch, root complex, minor). So a group of 2n GPUs is always two
groups of n, the nesting that keeps a node from fragmenting, and on a DGX-1 the pairs are the
double-linked ones. A group is listed only when it does not straddle a NUMA node or an NVLink
domain boundary (the whole node is always listed: it is the only way to use all GPUs). Every
listed group gets `allocationScore: 1`, the value every upstream table uses, so Koordinator's
ascending-score quirk (protocol §9.2) cannot bite.

`gpuLinkType` is "NVLink" when every hop of the group's ring is NVLink, else "PCIe".
`ringBusBandwidth` is the ring's bottleneck in bytes per second per direction: an NVSwitch hop
carries the smaller GPU's fabric links, a direct hop its links, a PCIe hop the smaller link's
nominal lane rate times width; absent when a hop's speed is unknown.

Policy: "Honor" when all GPUs sit in one NVSwitch domain and the count is a power of two (the HGX
layout Koordinator's built-in Hopper table describes); otherwise "Prefer". A config rule matching
the GPU model overrides the policy, the table, or both.
"""

from __future__ import annotations

from agent.config import AgentConfig
from agent.discovery.node_topology import GpuNode
from apis.interconnect import GpuPlace, Interconnect, best_groups, build_interconnect, known_nvlink_gbps
from apis.partitions import GPUPartition, GPUPartitionTable
from apis.quantity import Quantity

HONOR = "Honor"
PREFER = "Prefer"

# GB/s per lane per direction, by PCIe generation (after encoding overhead).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def _link_gbps(gpu: GpuNode) -> float | None:
    return known_nvlink_gbps(gpu.facts.name, gpu.facts.nvlink_version)


def _pcie_gbps(gpu: GpuNode) -> float | None:
    lane = PCIE_LANE_GBPS.get(gpu.facts.pcie_gen)
    return lane * gpu.facts.pcie_width if lane and gpu.facts.pcie_width else None


def _hop(a: GpuNode, b: GpuNode) -> tuple[str, float | None]:
    """(link type, GB/s) of the ring hop a -> b."""
    if a.nvlink_domain and a.nvlink_domain == b.nvlink_domain:
        speeds = [s for s in (_link_gbps(a), _link_gbps(b)) if s is not None]
        speed = min(speeds) if speeds else None
        # Through NVSwitch a hop carries the smaller fabric; directly, the links between the two.
        links = min(a.fabric_links, b.fabric_links) if a.nvswitch and b.nvswitch else a.peers.get(b.minor, 0)
        if links:
            return "NVLink", None if speed is None else links * speed
    rates = [_pcie_gbps(a), _pcie_gbps(b)]
    return "PCIe", None if None in rates else min(r for r in rates if r is not None)


def _ring(group: list[GpuNode]) -> tuple[str, Quantity | None]:
    if len(group) < 2:
        return ("NVLink" if group and group[0].nvlink_domain else ""), None
    hops = [_hop(group[i], group[(i + 1) % len(group)]) for i in range(len(group))]
    kinds = {k for k, _ in hops}
    link_type = "NVLink" if kinds == {"NVLink"} else "PCIe"
    speeds = [s for _, s in hops]
    if any(s is None for s in speeds):
        return link_type, None
    gbps = min(s for s in speeds if s is not None)
    return link_type, Quantity.of(round(gbps * 1e9))


def _locality(g: GpuNode) -> tuple:
    loc = g.location
    return (
        g.nvlink_domain == "",
        g.nvlink_domain,
        g.numa if g.numa >= 0 else 1 << 30,
        loc.switch if loc else "",
        loc.root_bus if loc else "",
        g.minor,
    )


def _sizes(n: int) -> list[int]:
    sizes, size = [], 1
    while size <= n:
        sizes.append(size)
        size *= 2
    if n not in sizes:
        sizes.append(n)
    return sizes


def interconnect_of(gpus: list[GpuNode]) -> Interconnect:
    """The node's interconnect matrix from what discovery found (live NVLinks only)."""
    places = [
        GpuPlace(
            minor=g.minor,
            numa=g.numa,
            socket=g.socket,
            pcie_root=g.location.root_bus if g.location else "",
            pcie_switch=g.location.switch if g.location else "",
            nvlinks=dict(g.peers),
        )
        for g in gpus
        if g.minor >= 0
    ]
    speeds = [s for s in (_link_gbps(g) for g in gpus) if s is not None]
    return build_interconnect(places, min(speeds) if speeds else 0.0)


def _nested_groups(usable: list[GpuNode], sizes: list[int]) -> dict[int, list[list[GpuNode]]]:
    """Per size, the groups: the best-connected cut of each group of the next larger size (and of
    what that cut left over), largest size first."""
    ic = interconnect_of(usable)
    by_minor = {g.minor: g for g in usable}
    order = {g.minor: i for i, g in enumerate(usable)}
    parents = [tuple(g.minor for g in usable)]
    out: dict[int, list[list[GpuNode]]] = {}
    for size in sorted(sizes, reverse=True):
        groups: list[tuple[int, ...]] = []
        next_parents: list[tuple[int, ...]] = []
        for parent in parents:
            cut = best_groups(ic, parent, size) if size <= len(parent) else []
            groups.extend(cut)
            taken = {m for group in cut for m in group}
            next_parents.extend(cut)
            rest = tuple(m for m in parent if m not in taken)
            if rest:
                next_parents.append(rest)
        groups.sort(key=lambda group: min(order[m] for m in group))
        out[size] = [[by_minor[m] for m in sorted(group, key=order.__getitem__)] for group in groups]
        parents = next_parents
    return out


def derive_table(gpus: list[GpuNode]) -> GPUPartitionTable | None:
    usable = sorted((g for g in gpus if g.minor >= 0), key=_locality)
    if not usable:
        return None
    table: dict[int, list[GPUPartition]] = {}
    sizes = _sizes(len(usable))
    grouped = _nested_groups(usable, sizes)
    for size in sizes:
        parts = []
        for group in grouped[size]:
            whole = size == len(usable)
            straddles = len({g.numa for g in group}) > 1 or len({g.nvlink_domain for g in group}) > 1
            if not whole and size > 1 and straddles:
                continue
            link_type, bandwidth = _ring(group)
            parts.append(
                GPUPartition(
                    minors=tuple(sorted(g.minor for g in group)),
                    gpu_link_type=link_type,
                    ring_bus_bandwidth=bandwidth,
                    allocation_score=1,
                )
            )
        if parts:
            table[size] = parts
    return GPUPartitionTable(table)


def derive_policy(gpus: list[GpuNode]) -> str:
    usable = [g for g in gpus if g.minor >= 0]
    n = len(usable)
    one_fabric = n > 1 and all(g.nvswitch for g in usable) and len({g.nvlink_domain for g in usable}) == 1
    return HONOR if one_fabric and n & (n - 1) == 0 else PREFER


def partitions_for(
    gpus: list[GpuNode], model: str, config: AgentConfig
) -> tuple[GPUPartitionTable | None, str]:
    """(table, policy) for the node, with the config's vendor rule applied."""
    table = derive_table(gpus)
    policy = derive_policy(gpus) if table is not None else ""
    rule = config.partition_rule(model) if model else None
    if rule is not None:
        if rule.table is not None:
            table = rule.table
        if rule.policy:
            policy = rule.policy
    return table, policy
