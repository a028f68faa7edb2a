"""What a node has, built once per Device resourceVersion: devices, topology scopes, partitions.

Everything is in internal units (percent ints, bytes), devices keep the Device CR's order, and
GPU sets are bitmasks over minors (bit `1 << minor`), so topology and partition checks are a few
integer operations. `NodeInventory` is immutable; `NodeState` adds what is in use.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from apis import keys
from apis import resources as rn
from apis.device import NUMA_UNKNOWN, Device, DeviceInfo
from apis.errors import CodecError
from apis.interconnect import GpuPlace, Interconnect, build_interconnect, nvlink_gbps
from apis.partitions import GPUPartition, GPUPartitionTable, parse_gpu_partitions

# Scope levels (Koordinator's DeviceTopologyScopeLevel).
LEVEL_NODE, LEVEL_NUMA, LEVEL_PCIE, LEVEL_DEVICE = 1, 2, 3, 4
SCOPE_LEVELS = {"Node": LEVEL_NODE, "NUMANode": LEVEL_NUMA, "PCIe": LEVEL_PCIE, "Device": LEVEL_DEVICE}
HOPPER_MODELS = ("H100", "H800", "H20")


@dataclass(frozen=True, slots=True)
class VF:
    bus_id: str
    minor: int
    group: int  # index of its VF group on the device


@dataclass(frozen=True, slots=True)
class DeviceSlot:
    """One device of the Device CR, in internal units."""

    type: str
    minor: int
    id: str
    health: bool
    labels: Mapping[str, str]
    total: Mapping[str, int]  # empty when unhealthy: it can never be chosen
    has_topology: bool
    numa: int  # NUMA_UNKNOWN (-1) when unknown or no topology
    socket: int  # -1 when unknown
    pcie_root: str  # Koordinator's pcieID (PCI root bus)
    pcie_scope: str  # the PCIe switch when the CR carries it, else the root bus ("" without topology)
    bus_id: str
    nvlink_domain: str
    vf_groups: tuple[tuple[Mapping[str, str], tuple[VF, ...]], ...]
    vfs_by_bus: tuple[VF, ...] = ()  # every VF, lowest busID first (the order VFs are handed out)
    nvlink_peers: tuple[tuple[int, int], ...] = ()  # (peer minor, live NVLinks), from the CR

    @property
    def bit(self) -> int:
        return 1 << self.minor

    @property
    def vfs(self) -> tuple[VF, ...]:
        return tuple(vf for _, group in self.vf_groups for vf in group)


@dataclass(frozen=True, slots=True)
class Scope:
    """A node of the GPU scope tree (protocol 8.3): Node > NUMANode > PCIe."""

    level: int
    name: str  # "node", the NUMA id as text, or the PCIe scope id
    minors: tuple[int, ...]  # ascending
    mask: int
    children: tuple[Scope, ...] = ()

    def walk(self) -> Iterable[Scope]:
        yield self
        for child in self.children:
            yield from child.walk()


@dataclass(frozen=True, slots=True)
class PartitionGroup:
    """Partitions of one GPU count sharing an allocationScore, in table order."""

    score: int
    partitions: tuple[tuple[GPUPartition, int], ...]  # (partition, minors bitmask)


@dataclass(frozen=True)
class NodeInventory:
    name: str
    labels: Mapping[str, str]  # Device labels
    devices: Mapping[str, tuple[DeviceSlot, ...]]  # type -> devices in CR order
    by_minor: Mapping[str, Mapping[int, DeviceSlot]]
    gpu_minors: tuple[int, ...]  # ascending
    gpu_mask: int  # every GPU minor, healthy or not
    gpu_healthy_mask: int  # GPUs with a non-empty total
    tree: Scope | None  # None when some GPU has no topology
    scopes_by_level: Mapping[int, tuple[Scope, ...]]
    nvlink_domains: Mapping[str, int]  # domain -> minors bitmask (sorted by name)
    sockets: Mapping[int, int]  # socket id -> minors bitmask (known sockets only)
    partitions: Mapping[int, tuple[PartitionGroup, ...]] | None  # size -> groups, best score first
    partition_honor: bool  # node policy Honor
    partition_source: str  # "device", "builtin" or ""
    secondary_well_planned: bool
    gpu_model: str
    gpu_vendor: str
    type_totals: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # per type, summed
    gpu_memory_size: int = 0  # bytes of one healthy GPU (the first in minor order)
    warnings: tuple[str, ...] = ()
    layout: int = 0  # equal for inventories with the same GPU scopes (see `layout_id`)
    # The pairwise interconnect matrix (apis/interconnect.py), built once per Device; None without
    # GPUs. `gpu_sets` is set when NVLink differs between pairs: the set chooser decides there.
    interconnect: Interconnect | None = None
    gpu_sets: bool = False

    def slots(self, dtype: str) -> tuple[DeviceSlot, ...]:
        return self.devices.get(dtype, ())

    def slot(self, dtype: str, minor: int) -> DeviceSlot | None:
        return self.by_minor.get(dtype, {}).get(minor)

    def has_type(self, dtype: str) -> bool:
        return bool(self.devices.get(dtype))

    def minors_of(self, mask: int) -> list[int]:
        return [m for m in self.gpu_minors if mask >> m & 1]


def _ints(resources: Mapping[str, Any]) -> dict[str, int]:
    return {name: qty.value() for name, qty in resources.items()}


_SHARED: dict[tuple[tuple[str, Any], ...], Mapping[str, Any]] = {}


def _shared(items: Mapping[str, Any]) -> Mapping[str, Any]:
    """A read-only copy of `items`, one per distinct content: every GPU of a model has the same
    totals and most devices the same (often no) labels, thousands of times over in a cluster."""
    key = tuple(items.items())
    found = _SHARED.get(key)
    if found is None:
        if len(_SHARED) >= 65536:  # distinct contents are few; never grow without bound
            _SHARED.clear()
        found = _SHARED[key] = MappingProxyType(dict(items))
    return found


def _slot(info: DeviceInfo) -> DeviceSlot:
    topo = info.topology
    groups = []
    for gi, group in enumerate(info.vf_groups):
        vfs = tuple(VF(vf.bus_id, vf.minor, gi) for vf in group.vfs)
        groups.append((_shared(group.labels), vfs))
    return DeviceSlot(
        type=info.type,
        minor=info.minor,
        id=info.id,
        health=info.health,
        labels=_shared(info.labels),
        total=_shared(_ints(info.resources) if info.health else {}),
        has_topology=topo is not None,
        numa=topo.node_id if topo is not None else NUMA_UNKNOWN,
        socket=topo.socket_id if topo is not None else -1,
        pcie_root=topo.pcie_id if topo is not None else "",
        pcie_scope=topo.pcie_scope if topo is not None else "",
        bus_id=topo.bus_id if topo is not None else "",
        nvlink_domain=info.nvlink.domain if info.nvlink is not None else "",
        vf_groups=tuple(groups),
        vfs_by_bus=tuple(sorted((vf for _, vfs in groups for vf in vfs), key=lambda v: v.bus_id)),
        nvlink_peers=tuple((p.minor, p.links) for p in info.nvlink.peers) if info.nvlink is not None else (),
    )


def _mask(minors: Iterable[int]) -> int:
    out = 0
    for m in minors:
        out |= 1 << m
    return out


def _scope(level: int, name: str, minors: Iterable[int], children: tuple[Scope, ...] = ()) -> Scope:
    ordered = tuple(sorted(set(minors)))
    return Scope(level, name, ordered, _mask(ordered), children)


def build_tree(gpus: tuple[DeviceSlot, ...]) -> Scope | None:
    """Node > NUMANode (ascending id) > PCIe scope (ascending id as text).

    GPUs whose NUMA node is unknown (-1) are not grouped into a NUMA scope: their PCIe scopes
    hang directly under the node scope.
    """
    if not gpus or any(not g.has_topology for g in gpus):
        return None
    by_numa: dict[int, dict[str, list[int]]] = {}
    for g in gpus:
        by_numa.setdefault(g.numa, {}).setdefault(g.pcie_scope, []).append(g.minor)
    children: list[Scope] = []
    for numa in sorted(n for n in by_numa if n != NUMA_UNKNOWN):
        pcies = by_numa[numa]
        kids = tuple(_scope(LEVEL_PCIE, p, pcies[p]) for p in sorted(pcies))
        children.append(_scope(LEVEL_NUMA, str(numa), (m for ms in pcies.values() for m in ms), kids))
    for p, minors in sorted(by_numa.get(NUMA_UNKNOWN, {}).items()):
        children.append(_scope(LEVEL_PCIE, p, minors))
    return _scope(LEVEL_NODE, "node", (g.minor for g in gpus), tuple(children))


def hopper_table() -> GPUPartitionTable:
    """Koordinator's built-in partition table for 8-GPU NVIDIA Hopper boards (protocol 9.1)."""
    table = {}
    for size in (1, 2, 4, 8):
        table[size] = [
            GPUPartition(tuple(range(start, start + size)), "NVLink", None, 1) for start in range(0, 8, size)
        ]
    return GPUPartitionTable(table)


def index_partitions(table: GPUPartitionTable) -> dict[int, tuple[PartitionGroup, ...]]:
    """Group each size's partitions by allocationScore, highest score first (table order inside)."""
    out: dict[int, tuple[PartitionGroup, ...]] = {}
    for size, parts in table.by_size.items():
        groups: dict[int, list[tuple[GPUPartition, int]]] = {}
        for p in parts:
            groups.setdefault(p.allocation_score, []).append((p, _mask(p.minors)))
        out[size] = tuple(PartitionGroup(s, tuple(groups[s])) for s in sorted(groups, reverse=True))
    return out


@functools.lru_cache(maxsize=256)
def _device_partitions(raw: str) -> Mapping[int, tuple[PartitionGroup, ...]]:
    """The index of a gpu-partitions annotation, shared by every node that carries the same text
    (one per GPU model in practice; the groups are immutable). Raises CodecError."""
    return MappingProxyType(index_partitions(parse_gpu_partitions(raw)))


def node_partition_choice(
    labels: Mapping[str, str],
) -> tuple[Mapping[int, tuple[PartitionGroup, ...]] | None, str, bool]:
    """Partition index, its source and the Honor policy a Device without its own table gets from
    the Node's labels: the built-in Hopper table for nvidia H100/H800/H20 (8.3 step 2)."""
    honor = labels.get(keys.GPU_PARTITION_POLICY) == "Honor"
    if labels.get(keys.GPU_VENDOR, "") in ("", "nvidia") and labels.get(keys.GPU_MODEL) in HOPPER_MODELS:
        return MappingProxyType(index_partitions(hopper_table())), "builtin", honor
    return None, "", honor


def build_inventory(
    device: Device | Mapping[str, Any], node_labels: Mapping[str, str] | None = None
) -> NodeInventory:
    """The inventory of one node. `node_labels` choose the built-in partition table and its policy
    when the Device carries no table (protocol 8.3 step 2); without them the Device's labels stand in
    (the slo-controller copies them to the Node).

    Raises CodecError when `device` is a dict that does not decode.
    """
    if not isinstance(device, Device):
        device = Device.from_dict(device)
    node_labels = dict(device.labels if node_labels is None else node_labels)
    warnings: list[str] = []
    devices: dict[str, list[DeviceSlot]] = {}
    for info in device.devices:
        devices.setdefault(info.type, []).append(_slot(info))
    frozen = {t: tuple(slots) for t, slots in devices.items()}
    by_minor: dict[str, dict[int, DeviceSlot]] = {}
    for t, slots in frozen.items():
        table: dict[int, DeviceSlot] = {}
        for s in slots:
            table.setdefault(s.minor, s)
        by_minor[t] = table
    gpus = tuple(sorted(frozen.get(rn.DeviceType.GPU, ()), key=lambda s: s.minor))
    tree = build_tree(gpus)
    levels: dict[int, list[Scope]] = {}
    if tree is not None:
        for scope in tree.walk():
            levels.setdefault(scope.level, []).append(scope)
    domains: dict[str, list[int]] = {}
    sockets: dict[int, list[int]] = {}
    for g in gpus:
        if g.nvlink_domain:
            domains.setdefault(g.nvlink_domain, []).append(g.minor)
        if g.socket >= 0:
            sockets.setdefault(g.socket, []).append(g.minor)

    partitions = None
    source = ""
    honor = False
    raw = device.annotations.get(keys.GPU_PARTITIONS)
    if raw is not None:
        try:
            partitions = _device_partitions(raw)
            source = "device"
            honor = device.honors_gpu_partitions
        except CodecError as exc:
            warnings.append(f"ignored malformed {keys.GPU_PARTITIONS} annotation: {exc}")
    if partitions is None:
        partitions, source, honor = node_partition_choice(node_labels)

    inv = NodeInventory(
        name=device.name,
        labels=MappingProxyType(dict(device.labels)),
        devices=MappingProxyType(frozen),
        by_minor=MappingProxyType({t: MappingProxyType(v) for t, v in by_minor.items()}),
        gpu_minors=tuple(g.minor for g in gpus),
        gpu_mask=_mask(g.minor for g in gpus),
        gpu_healthy_mask=_mask(g.minor for g in gpus if g.total),
        tree=tree,
        scopes_by_level=MappingProxyType({lvl: tuple(s) for lvl, s in levels.items()}),
        nvlink_domains=MappingProxyType({d: _mask(domains[d]) for d in sorted(domains)}),
        sockets=MappingProxyType({s: _mask(sockets[s]) for s in sorted(sockets)}),
        partitions=None if partitions is None else MappingProxyType(dict(partitions)),
        partition_honor=honor,
        partition_source=source,
        secondary_well_planned=device.secondary_device_well_planned,
        gpu_model=device.gpu_model,
        gpu_vendor=device.gpu_vendor,
        type_totals=summed_totals(frozen),
        gpu_memory_size=next((g.total[rn.GPU_MEMORY] for g in gpus if g.total.get(rn.GPU_MEMORY)), 0),
        warnings=tuple(warnings),
        interconnect=(ic := node_interconnect(gpus, device.gpu_model)),
        gpu_sets=ic is not None and ic.has_nvlink and not ic.uniform_nvlink,
    )
    object.__setattr__(inv, "layout", layout_id(inv))
    return inv


_INTERCONNECTS: dict[tuple[Any, ...], Interconnect] = {}


def node_interconnect(gpus: tuple[DeviceSlot, ...], model: str) -> Interconnect | None:
    """The node's pairwise interconnect matrix from its GPU slots (None without GPUs); one shared
    instance per distinct matrix, so a thousand nodes of one machine type hold one."""
    if not gpus:
        return None
    speed = nvlink_gbps(model)
    key = (
        speed,
        tuple((g.minor, g.numa, g.socket, g.pcie_root, g.pcie_scope, g.nvlink_peers) for g in gpus),
    )
    found = _INTERCONNECTS.get(key)
    if found is None:
        places = [
            GpuPlace(
                minor=g.minor,
                numa=g.numa,
                socket=g.socket,
                pcie_root=g.pcie_root,
                pcie_switch=g.pcie_scope if g.pcie_scope != g.pcie_root else "",
                nvlinks=dict(g.nvlink_peers),
            )
            for g in gpus
        ]
        if len(_INTERCONNECTS) > 4096:
            _INTERCONNECTS.clear()
        found = _INTERCONNECTS[key] = build_interconnect(places, speed)
    return found


def summed_totals(devices: Mapping[str, tuple[DeviceSlot, ...]]) -> Mapping[str, Mapping[str, int]]:
    out: dict[str, Mapping[str, int]] = {}
    for dtype, slots in devices.items():
        summed: dict[str, int] = {}
        for s in slots:
            for name, value in s.total.items():
                summed[name] = summed.get(name, 0) + value
        out[dtype] = MappingProxyType(summed)
    return MappingProxyType(out)


def all_unhealthy(inv: NodeInventory) -> NodeInventory:
    """The inventory with every device unhealthy and offering nothing (its Device CR is gone)."""
    dead = {
        t: tuple(replace(s, health=False, total=MappingProxyType({})) for s in slots)
        for t, slots in inv.devices.items()
    }
    by_minor = {t: MappingProxyType({s.minor: s for s in slots}) for t, slots in dead.items()}
    return replace(
        inv,
        devices=MappingProxyType(dead),
        by_minor=MappingProxyType(by_minor),
        gpu_healthy_mask=0,
        type_totals=summed_totals(dead),
        gpu_memory_size=0,
    )


_LAYOUTS: dict[tuple[Any, ...], int] = {}


def layout_id(inv: NodeInventory) -> int:
    """A small int naming the GPU topology (NVLink domains, PCIe and NUMA scopes, sockets as
    bitmasks): results that depend only on it and on bitmasks are shared between nodes."""
    key = (
        tuple(inv.nvlink_domains.values()),
        tuple(
            tuple(s.mask for s in inv.scopes_by_level.get(level, ())) for level in (LEVEL_PCIE, LEVEL_NUMA)
        ),
        tuple(inv.sockets.values()),
        None if inv.interconnect is None else inv.interconnect.signature(),
    )
    found = _LAYOUTS.get(key)
    if found is None:
        found = _LAYOUTS[key] = len(_LAYOUTS) + 1
    return found
