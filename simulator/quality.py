"""Allocation quality beyond packing: the interconnect each multi-GPU pod got and the NIC each GPU
of a joint GPU+RDMA pod got, read from the Device CR facts of the node it landed on.

Levels are defined by the hardware, not by any chooser: a set of GPUs is

* ``nvlink`` when every GPU names the same `nvlink.domain` (an NVSwitch board or a bridged pair),
* ``pcie`` when every GPU sits in the same PCIe scope (the switch, `topology.pcieSwitchID`, where
  the Device CR carries it, else the root bus `topology.pcieID`),
* ``numa`` when every GPU reports the same known NUMA node,
* ``socket`` when every GPU reports the same known socket,
* ``cross`` otherwise (across sockets, or NUMA and socket unknown as on a VM).

The best a pod of k GPUs could get on a node type is the highest level that some k GPUs of that
(empty) node share; a pod is "at best" when it got that level. A NIC is ``pcie`` to its GPU when
the two share the PCIe scope, ``numa`` when they share a known NUMA node, else ``cross``; a joint
pod's NIC level is the worst over its GPUs, and the hardware allows SamePCIe when each of the
pod's GPUs has some NIC in its PCIe scope on that node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from allocator.core.node.inventory import NodeInventory
from apis import resources as rn
from apis.device import NUMA_UNKNOWN
from simulator.cluster import Placed, SimRequest

GPU, RDMA = rn.DeviceType.GPU, rn.DeviceType.RDMA

CROSS, SOCKET, NUMA, PCIE, NVLINK = range(5)
LEVEL_NAMES = ("cross", "socket", "numa", "pcie", "nvlink")
NOT_PLACED, NO_TOPOLOGY = -1, -2  # what an arrived multi-GPU pod got besides a level
LOAD_BINS = tuple(range(10, 140, 10))  # arrived % upper edges: (0, 10], (10, 20], ..., (120, 130]


def gpu_set_level(inv: NodeInventory, minors: Sequence[int]) -> int | None:
    """The level a set of GPUs shares (None: the node's Device carries no topology for them)."""
    slots = [inv.slot(GPU, m) for m in minors]
    if any(s is None for s in slots):
        raise ValueError(f"{inv.name}: GPU minors {list(minors)} are not all on the node")
    domains = {s.nvlink_domain for s in slots if s is not None}
    if len(domains) == 1 and "" not in domains:
        return NVLINK
    if not all(s is not None and s.has_topology for s in slots):
        return None
    if len({s.pcie_scope for s in slots if s is not None}) == 1:
        return PCIE
    numas = {s.numa for s in slots if s is not None}
    if len(numas) == 1 and NUMA_UNKNOWN not in numas:
        return NUMA
    sockets = {s.socket for s in slots if s is not None}
    if len(sockets) == 1 and -1 not in sockets:
        return SOCKET
    return CROSS


def _groups(inv: NodeInventory, level: int) -> list[int]:
    """Sizes of the groups of the node's GPUs that share ``level``."""
    keys: dict[object, int] = {}
    for s in inv.slots(GPU):
        if level == NVLINK:
            key: object = s.nvlink_domain or None
        elif not s.has_topology:
            key = None
        elif level == PCIE:
            key = s.pcie_scope
        elif level == NUMA:
            key = None if s.numa == NUMA_UNKNOWN else s.numa
        else:
            key = None if s.socket < 0 else s.socket
        if key is not None:
            keys[key] = keys.get(key, 0) + 1
    return list(keys.values())


_BEST: dict[tuple[int, int], int | None] = {}


def best_level(inv: NodeInventory, count: int) -> int | None:
    """The highest level any ``count`` GPUs of this node share (None: no topology, or too few
    GPUs). Cached per GPU layout (`NodeInventory.layout` names the domains and scopes)."""
    key = (inv.layout, count)
    if key in _BEST:
        return _BEST[key]
    found: int | None = None
    if count <= len(inv.gpu_minors):
        for level in (NVLINK, PCIE, NUMA, SOCKET):
            if max(_groups(inv, level), default=0) >= count:
                found = level
                break
        else:
            if all(s.has_topology for s in inv.slots(GPU)):
                found = CROSS
    _BEST[key] = found
    return found


def nic_level(inv: NodeInventory, gpu: int, nics: Iterable[int]) -> int:
    """How close the closest of ``nics`` is to GPU ``gpu``: PCIE, NUMA or CROSS."""
    g = inv.slot(GPU, gpu)
    best = CROSS
    for minor in nics:
        n = inv.slot(RDMA, minor)
        if g is None or n is None or not (g.has_topology and n.has_topology):
            continue
        if g.pcie_scope and g.pcie_scope == n.pcie_scope:
            return PCIE
        if g.numa != NUMA_UNKNOWN and g.numa == n.numa:
            best = NUMA
    return best


def same_pcie_possible(inv: NodeInventory, gpus: Iterable[int]) -> bool:
    """Whether each of these GPUs has some NIC of the node in its PCIe scope."""
    nics = [n.minor for n in inv.slots(RDMA)]
    return all(nic_level(inv, g, nics) == PCIE for g in gpus)


@dataclass
class Placement:
    """One placed pod's quality facts."""

    gpus: int  # whole GPUs (0 for shares and CPU-only pods)
    level: int | None  # the GPU set's level (None: fewer than 2 GPUs or no topology)
    best: int | None  # the best level for its size on that node
    nic: int | None = None  # the worst GPU-to-NIC level (None: not a GPU+RDMA pod)
    nic_possible: bool = False  # the node could have given SamePCIe to each of its GPUs
    arrived_pct: float = 0.0


def placement_quality(
    inv: NodeInventory | None, gpu_minors: Sequence[int], rdma_minors: Sequence[int], whole: bool
) -> Placement:
    """The quality facts of one pod that got ``gpu_minors`` (whole GPUs when ``whole``) and
    ``rdma_minors`` on a node with inventory ``inv``."""
    count = len(gpu_minors) if whole else 0
    if inv is None or not gpu_minors:
        return Placement(count, None, None)
    level = best = None
    if whole and count >= 2:
        level = gpu_set_level(inv, gpu_minors)
        best = best_level(inv, count) if level is not None else None
    nic = None
    possible = False
    if rdma_minors:
        nic = min(nic_level(inv, g, rdma_minors) for g in gpu_minors)
        possible = same_pcie_possible(inv, gpu_minors)
    return Placement(count, level, best, nic, possible)


@dataclass
class QualityStats:
    """Counts over one run's placements."""

    multi: dict[int, list[int]] = field(default_factory=dict)  # GPUs -> pods per level (5 counters)
    multi_at_best: dict[int, int] = field(default_factory=dict)  # GPUs -> pods at their best level
    multi_no_topology: dict[int, int] = field(default_factory=dict)  # GPUs -> pods on nodes without topology
    arrived: dict[int, int] = field(default_factory=dict)  # GPUs -> multi-GPU pods that arrived
    nic: list[int] = field(default_factory=lambda: [0] * len(LEVEL_NAMES))  # joint pods per NIC level
    nic_possible: int = 0  # joint pods on nodes where SamePCIe was possible for every GPU
    nic_possible_same: int = 0  # ... of which got SamePCIe
    # per load bin: multi-GPU pods placed, of which at their best level
    load_multi: list[int] = field(default_factory=lambda: [0] * len(LOAD_BINS))
    load_at_best: list[int] = field(default_factory=lambda: [0] * len(LOAD_BINS))
    load_nvlink: list[int] = field(default_factory=lambda: [0] * len(LOAD_BINS))
    load_arrived: list[int] = field(default_factory=lambda: [0] * len(LOAD_BINS))
    # every arrived multi-GPU pod: (load when it arrived, its level, NOT_PLACED or NO_TOPOLOGY)
    arrivals: list[tuple[float, int]] = field(default_factory=list)

    def add(self, p: Placement) -> None:
        if p.gpus >= 2:
            if p.level is None or p.best is None:
                self.multi_no_topology[p.gpus] = self.multi_no_topology.get(p.gpus, 0) + 1
            else:
                self.multi.setdefault(p.gpus, [0] * len(LEVEL_NAMES))[p.level] += 1
                at_best = p.level >= p.best
                self.multi_at_best[p.gpus] = self.multi_at_best.get(p.gpus, 0) + at_best
                b = load_bin(p.arrived_pct)
                self.load_multi[b] += 1
                self.load_at_best[b] += at_best
                self.load_nvlink[b] += p.level == NVLINK
        if p.nic is not None:
            self.nic[p.nic] += 1
            if p.nic_possible:
                self.nic_possible += 1
                self.nic_possible_same += p.nic == PCIE

    # -- summaries (percent; NaN where nothing was counted) ----------------------------------------
    @property
    def multi_total(self) -> int:
        return sum(sum(c) for c in self.multi.values())

    def at_best_pct(self, gpus: int | None = None) -> float:
        if gpus is None:
            return _pct(sum(self.multi_at_best.values()), self.multi_total)
        return _pct(self.multi_at_best.get(gpus, 0), sum(self.multi.get(gpus, ())))

    def level_pct(self, level: int, gpus: int | None = None, *, or_better: bool = False) -> float:
        """% of the multi-GPU pods (of ``gpus`` GPUs, or all) that got ``level`` (or better)."""
        rows = list(self.multi.values()) if gpus is None else [self.multi.get(gpus, [0] * len(LEVEL_NAMES))]
        hit = sum(sum(c[level:]) if or_better else c[level] for c in rows)
        return _pct(hit, sum(sum(c) for c in rows))

    def placed(self, gpus: int | None = None) -> int:
        return self.multi_total if gpus is None else sum(self.multi.get(gpus, ()))

    def arrived_level_pct(self, level: int, gpus: int) -> float:
        """% of the arrived multi-GPU pods of ``gpus`` GPUs placed at ``level`` or better (a pod
        never placed counts as below every level; pods placed where no level is known are left out)."""
        whole = self.arrived.get(gpus, 0) - self.multi_no_topology.get(gpus, 0)
        return _pct(sum(self.multi.get(gpus, [0] * len(LEVEL_NAMES))[level:]), whole)

    def nic_pct(self, level: int) -> float:
        return _pct(self.nic[level], sum(self.nic))

    def nic_possible_pct(self) -> float:
        return _pct(self.nic_possible_same, self.nic_possible)

    def merge(self, other: QualityStats) -> None:
        """Add another run's counts (to pool seeds for the per-load curves)."""
        for gpus, counts in other.multi.items():
            mine = self.multi.setdefault(gpus, [0] * len(LEVEL_NAMES))
            for i, c in enumerate(counts):
                mine[i] += c
        for gpus, n in other.multi_at_best.items():
            self.multi_at_best[gpus] = self.multi_at_best.get(gpus, 0) + n
        for gpus, n in other.multi_no_topology.items():
            self.multi_no_topology[gpus] = self.multi_no_topology.get(gpus, 0) + n
        for gpus, n in other.arrived.items():
            self.arrived[gpus] = self.arrived.get(gpus, 0) + n
        self.nic = [a + b for a, b in zip(self.nic, other.nic, strict=True)]
        self.nic_possible += other.nic_possible
        self.nic_possible_same += other.nic_possible_same
        for name in ("load_multi", "load_at_best", "load_nvlink", "load_arrived"):
            setattr(
                self, name, [a + b for a, b in zip(getattr(self, name), getattr(other, name), strict=True)]
            )
        self.arrivals.extend(other.arrivals)

    def load_curve(self, *, nvlink: bool = False, of_arrived: bool = False) -> list[float]:
        """Per load bin: % of the multi-GPU pods placed then (or arrived then) that got their best
        level (or one NVLink domain)."""
        hits = self.load_nvlink if nvlink else self.load_at_best
        whole = self.load_arrived if of_arrived else self.load_multi
        return [_pct(a, n) for a, n in zip(hits, whole, strict=True)]


def load_bin(arrived_pct: float) -> int:
    for i, edge in enumerate(LOAD_BINS):
        if arrived_pct <= edge:
            return i
    return len(LOAD_BINS) - 1


def _pct(part: int, whole: int) -> float:
    return part * 100.0 / whole if whole else float("nan")


def joint_gpu_nic(req: SimRequest) -> bool:
    """A joint GPU+RDMA request (`device-joint-allocate` naming both types)."""
    types = req.pod.joint_types
    return GPU in types and RDMA in types


def wants_quality(req: SimRequest) -> bool:
    """Whether a pod has anything to measure here: 2+ whole GPUs, or a joint GPU+NIC request."""
    return (req.gpu_count >= 2 and not req.sharing) or joint_gpu_nic(req)


def record(stats: QualityStats, req: SimRequest, placed: Placed | None, arrived_pct: float) -> None:
    """Add an arrived pod's facts to ``stats``: for a placed one (``placed``), its devices read
    against the facts of the node it was counted on."""
    if not wants_quality(req):
        return
    multi = req.gpu_count >= 2 and not req.sharing
    if multi:
        stats.arrived[req.gpu_count] = stats.arrived.get(req.gpu_count, 0) + 1
        stats.load_arrived[load_bin(arrived_pct)] += 1
    if placed is None or not placed.allocation.devices.by_type:
        if multi:
            stats.arrivals.append((arrived_pct, NOT_PLACED if placed is None else NO_TOPOLOGY))
        return
    allocations = placed.allocation.devices
    nics = allocations.minors(RDMA) if joint_gpu_nic(req) else []
    inventory = placed.state.inventory
    placement = placement_quality(inventory, allocations.minors(GPU), nics, whole=not req.sharing)
    placement.arrived_pct = arrived_pct
    stats.add(placement)
    if multi:
        stats.arrivals.append((arrived_pct, NO_TOPOLOGY if placement.level is None else placement.level))


def equal_count_edges(loads: Sequence[float], *, at_least: int = 15, most: int = 10) -> list[float]:
    """Edges of load bins that each hold about as many of `loads` (at least `at_least`, so no
    share is a percentage of two pods; at most `most` bins): the first edge below the lowest load,
    each inner edge halfway between the last load of one bin and the first of the next."""
    ordered = sorted(loads)
    if not ordered:
        return []
    bins = max(1, min(most, len(ordered) // at_least))
    cuts = [round(i * len(ordered) / bins) for i in range(1, bins)]
    inner = [(ordered[c - 1] + ordered[c]) / 2 for c in cuts if ordered[c - 1] < ordered[c]]
    return [min(0.0, ordered[0]), *inner, max(ordered[-1], 100.0)]


def binned_share(
    arrivals: Sequence[tuple[float, int]], edges: Sequence[float], *, of_arrived: bool
) -> tuple[list[float], list[int]]:
    """Per bin of `edges`: the % in one NVLink domain of the multi-GPU pods that arrived then and
    were placed with a known level (or, `of_arrived`, of all that arrived then, a pod never placed
    counting as not in one; pods placed where no level is known are left out), and how many
    pods that % is of."""
    hits, whole = [0] * (len(edges) - 1), [0] * (len(edges) - 1)
    for load, level in arrivals:
        if level == NO_TOPOLOGY or (level == NOT_PLACED and not of_arrived):
            continue
        i = next((j for j in range(len(edges) - 1) if load <= edges[j + 1]), len(edges) - 2)
        whole[i] += 1
        hits[i] += level == NVLINK
    return [_pct(h, n) for h, n in zip(hits, whole, strict=True)], whole
