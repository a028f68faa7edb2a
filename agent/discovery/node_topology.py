"""The node's device topology: NVML's GPU facts joined with sysfs (PCIe chain, NUMA, socket, RDMA).

NUMA comes from the kernel (`numa_node` of the PCI function) and -1 stays -1 ("unknown"); NVML's
own NUMA id is used only when sysfs has no answer. NVLink domains are the connected components of
GPUs and NVSwitch chips over active links, so every GPU of an NVSwitch system lands in one domain
even though no GPU links to another GPU directly.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from agent.discovery.gpu_facts import REMOTE_GPU, REMOTE_SWITCH, GpuFacts
from agent.discovery.sysfs import NUMA_UNKNOWN, PciLocation, RdmaDevice, Sysfs


@dataclass
class GpuNode:
    facts: GpuFacts
    location: PciLocation | None
    numa: int
    socket: int
    nvlink_domain: str = ""
    nvswitch: bool = False
    fabric_links: int = 0  # active NVLinks into the NVSwitch fabric
    peers: dict[int, int] = field(default_factory=dict)  # peer minor -> NVLinks to it
    problems: list[str] = field(default_factory=list)

    @property
    def minor(self) -> int:
        return self.facts.minor


@dataclass
class NicNode:
    rdma: RdmaDevice
    minor: int
    numa: int
    socket: int
    problems: list[str] = field(default_factory=list)

    @property
    def location(self) -> PciLocation:
        return self.rdma.location


@dataclass
class NodeTopology:
    gpus: list[GpuNode]
    nics: list[NicNode]
    numa_cpus: dict[int, str]
    numa_sockets: dict[int, int]
    problems: list[str] = field(default_factory=list)

    def gpu(self, minor: int) -> GpuNode | None:
        return next((g for g in self.gpus if g.minor == minor), None)


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _nvlink_domains(gpus: list[GpuNode]) -> None:
    uf = _UnionFind()
    by_bus = {g.facts.bus_id: g for g in gpus}
    switched: set[str] = set()
    for g in gpus:
        for link in g.facts.links:
            if link.remote_type == REMOTE_SWITCH:
                uf.union("gpu:" + g.facts.bus_id, "nvs:" + link.remote_bus)
                switched.add(g.facts.bus_id)
            elif link.remote_type == REMOTE_GPU:
                uf.union("gpu:" + g.facts.bus_id, "gpu:" + link.remote_bus)
    members: dict[str, list[GpuNode]] = {}
    for g in gpus:
        if g.facts.links:
            members.setdefault(uf.find("gpu:" + g.facts.bus_id), []).append(g)
    ordered = sorted(members.values(), key=lambda ms: min(m.minor for m in ms))
    for number, domain in enumerate(ordered):
        has_switch = any(m.facts.bus_id in switched for m in domain)
        for g in domain:
            g.nvlink_domain = f"nvlink{number}"
            g.nvswitch = has_switch
            g.fabric_links = sum(1 for link in g.facts.links if link.remote_type == REMOTE_SWITCH)
            direct = Counter(link.remote_bus for link in g.facts.links if link.remote_type == REMOTE_GPU)
            peers: dict[int, int] = {}
            for bus, count in direct.items():
                peer = by_bus.get(bus)
                if peer is not None and peer.minor >= 0:
                    peers[peer.minor] = count
            if has_switch and g.fabric_links:
                for other in domain:
                    if other is not g and other.minor >= 0:
                        peers[other.minor] = peers.get(other.minor, 0) + g.fabric_links
            g.peers = dict(sorted(peers.items()))


def rdma_minor(name: str) -> int | None:
    """Koordinator's minor for an RDMA device: the number at the end of the ibdev name."""
    match = re.search(r"(\d+)$", name)
    return int(match.group(1)) if match else None


def build_topology(gpus: list[GpuFacts], sysfs: Sysfs, rdma: list[RdmaDevice] | None = None) -> NodeTopology:
    numa_cpus = sysfs.numa_nodes()
    numa_sockets = sysfs.numa_sockets(numa_cpus)
    nodes: list[GpuNode] = []
    for facts in gpus:
        problems: list[str] = []
        location = sysfs.pci(facts.bus_id) if facts.bus_id else None
        if facts.bus_id and location is None:
            problems.append(f"PCI device {facts.bus_id} not found in sysfs")
        numa = location.numa_node if location is not None else NUMA_UNKNOWN
        if location is None and facts.nvml_numa is not None and facts.nvml_numa >= 0:
            numa = facts.nvml_numa  # the kernel had no answer; NVML's is the next best
        socket = numa_sockets.get(numa, -1) if numa >= 0 else -1
        nodes.append(GpuNode(facts, location, numa, socket, problems=problems))
    _nvlink_domains(nodes)
    nodes.sort(key=lambda g: (g.minor < 0, g.minor, g.facts.index))

    nics: list[NicNode] = []
    used: set[int] = set()
    devices = sysfs.rdma_devices() if rdma is None else rdma
    pending: list[RdmaDevice] = []
    for dev in devices:
        minor = rdma_minor(dev.name)
        if minor is None or minor in used:
            pending.append(dev)
            continue
        used.add(minor)
        nics.append(_nic(dev, minor, numa_sockets))
    for dev in pending:  # names without a usable number (or a clash): next free minors, in PCI order
        minor = next(m for m in range(len(used) + len(pending) + 1) if m not in used)
        used.add(minor)
        nic = _nic(dev, minor, numa_sockets)
        nic.problems.append(
            f"RDMA device {dev.name}: minor {minor} assigned (name gives none or a duplicate)"
        )
        nics.append(nic)
    nics.sort(key=lambda n: n.minor)
    return NodeTopology(nodes, nics, numa_cpus, numa_sockets, problems=list(sysfs.problems))


def _nic(dev: RdmaDevice, minor: int, numa_sockets: dict[int, int]) -> NicNode:
    numa = dev.location.numa_node
    return NicNode(dev, minor, numa, numa_sockets.get(numa, -1) if numa >= 0 else -1)
