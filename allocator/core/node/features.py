"""Request-independent node summaries that decide filter verdicts and score components, as
`NodeTable` feature columns: nodes equal in a feature are decided once for a request shape.

The inventory class is the Device CR without what is particular to one node (its name, device
ids, Device labels, decode warnings): the allocator's decisions read none of those, and nodes of
one machine type share a class. `tests/core/test_columns.py` holds every grouping below to the
per-node computation on random clusters whose nodes differ in exactly those particulars.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from allocator.core.node.inventory import DeviceSlot, NodeInventory, Scope
from allocator.core.node.kubelet_view import view_key
from allocator.core.node.state import NodeState
from apis import keys
from apis import resources as rn


@dataclass(frozen=True, slots=True)
class Feature:
    """A per-node value for `NodeTable.feature`: hashable (interned to ids) or, with `raw`, an int."""

    name: str
    extract: Callable[[NodeState], Any]
    raw: bool = False


@dataclass(frozen=True, slots=True)
class Rows:
    """A per-node sequence of ints for `NodeTable.rows`: one row of a 2-D column per node, padded
    with `pad` to the longest row (e.g. each GPU's free share)."""

    name: str
    extract: Callable[[NodeState], Sequence[int]]
    pad: int = -1


_CLASSES: dict[Hashable, int] = {}
_class_ids = itertools.count(1)


def inventory_class(inv: NodeInventory | None) -> int:
    """A small int equal for inventories that differ only in name, device ids, Device labels and
    warnings (0 for no inventory). Computed once per inventory; ids are never reused."""
    if inv is None:
        return 0
    found = inv.__dict__.get("_class_id")
    if found is None:
        key = _inventory_key(inv)
        found = _CLASSES.get(key)
        if found is None:
            if len(_CLASSES) > 10_000:
                _CLASSES.clear()
            found = _CLASSES[key] = next(_class_ids)
        object.__setattr__(inv, "_class_id", found)
    return found


def _inventory_key(inv: NodeInventory) -> Hashable:
    partitions = None
    if inv.partitions is not None:
        partitions = tuple(
            (size, tuple((g.score, tuple((_partition_key(p), m) for p, m in g.partitions)) for g in groups))
            for size, groups in inv.partitions.items()
        )
    return (
        tuple((t, tuple(_slot_key(s) for s in slots)) for t, slots in inv.devices.items()),
        inv.gpu_minors,
        inv.gpu_mask,
        inv.gpu_healthy_mask,
        None if inv.tree is None else _scope_key(inv.tree),
        tuple((lvl, tuple(_scope_key(s, deep=False) for s in ss)) for lvl, ss in inv.scopes_by_level.items()),
        tuple(inv.nvlink_domains.items()),
        tuple(inv.sockets.items()),
        partitions,
        inv.partition_honor,
        inv.partition_source,
        inv.secondary_well_planned,
        inv.gpu_model,
        inv.gpu_vendor,
        tuple((t, _items(m)) for t, m in inv.type_totals.items()),
        inv.gpu_memory_size,
        inv.layout,
    )


def _items(mapping: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(mapping.items()))


def _slot_key(s: DeviceSlot) -> Hashable:
    return (
        s.type,
        s.minor,
        s.health,
        _items(s.labels),
        _items(s.total),
        s.has_topology,
        s.numa,
        s.socket,
        s.pcie_root,
        s.pcie_scope,
        s.bus_id,
        s.nvlink_domain,
        tuple((_items(labels), vfs) for labels, vfs in s.vf_groups),
        s.vfs_by_bus,
    )


def _scope_key(s: Scope, deep: bool = True) -> Hashable:
    children = tuple(_scope_key(c) for c in s.children) if deep else ()
    return (s.level, s.name, s.minors, s.mask, children)


def _partition_key(p: Any) -> Hashable:
    bandwidth = p.ring_bus_bandwidth
    return (p.minors, p.gpu_link_type, None if bandwidth is None else bandwidth.nanos, p.allocation_score)


def usage_key(state: NodeState) -> Hashable:
    """What the node's pods use, per device (resources) and per NIC (VFs taken)."""
    used = tuple(sorted((t, m, _items(res)) for t, per in state.used.items() for m, res in per.items()))
    vfs = tuple(
        sorted(
            (t, m, tuple(sorted(taken)))
            for t, per in state.vf_taken.items()
            for m, taken in per.items()
            if taken
        )
    )
    return used, vfs


def admission_key(state: NodeState) -> Hashable:
    """What the verdict reads of a node besides its devices: the isolation-provider label, and on a
    node whose kubelet aligns devices by NUMA, what its Topology Manager reads (devices.numa_policy;
    () elsewhere, so those nodes group as before)."""
    return state.labels.get(keys.GPU_ISOLATION_PROVIDER, ""), view_key(state)


_NO_POD_LIMIT = 1 << 30  # pods a node takes when its allocatable names no limit


# -- the features ----------------------------------------------------------------------------------

# Everything `allocate.fits` reads of a node: inventory, device usage, the isolation-provider label
# (a device type's handler may name a coarser feature for requests it decides from summaries:
# `gpu_features`).
FITS_EXACT = Feature("fits:exact", lambda s: (inventory_class(s.inventory), usage_key(s), admission_key(s)))
USAGE = Feature("usage", lambda s: (inventory_class(s.inventory), usage_key(s)))
CPU_FREE = Feature("cpu_free", lambda s: s.cpu_free_milli, raw=True)
KINDS = Feature("kinds", lambda s: s.resource_kinds)
MEMORY_FREE = Feature("memory_free", lambda s: s.memory_free, raw=True)
# Pods the node still takes (kube-scheduler's pod count check).
PODS_FREE = Feature("pods_free", lambda s: s.allocatable.get(rn.PODS, _NO_POD_LIMIT) - s.pod_count, raw=True)
