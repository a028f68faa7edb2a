"""One node's live state: its inventory plus what the pods on it use, with summaries kept up to date.

`add_pod` / `remove_pod` touch only the devices named in the pod's allocation and bump `version`.
Summaries the allocator and scorers read in O(1): free resources per device, requested
cpu/memory, and per device type the type's own summary (`summaries`, made by the type's class in
`summaries.SUMMARIES` and updated device by device; `GPUSummary.of(state)` reads the GPUs').
Values a summary derives (feasible-device masks per request shape) are computed on first use and
dropped when one of its devices changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from allocator.core.node.inventory import NodeInventory, all_unhealthy, build_inventory
from allocator.core.node.summaries import SUMMARIES, whole_gpus_free
from allocator.core.node.summary import DeviceSummary
from allocator.core.request.usage import CLAIM_KEY_PREFIX, ROOM_KEY_PREFIX, PodUsage, pod_usage
from apis import resources as rn
from apis.annotations import DeviceAllocations
from apis.quantity import Quantity


class ChangeLog(Protocol):
    """Where a node reports its changes: the node table (`node.table.NodeTable`) of the ClusterState
    it belongs to. A Protocol, so this module never imports the table, which reads NodeStates."""

    def touch(self, slot: int) -> None: ...


@dataclass(frozen=True, slots=True)
class PodEntry:
    key: str
    allocations: DeviceAllocations | None
    cpu_milli: int
    memory: int
    nonzero_cpu_milli: int
    nonzero_memory: int
    used: tuple[tuple[str, int, tuple[tuple[str, int], ...]], ...]  # (type, minor, resources)
    vfs: tuple[tuple[str, int, str], ...]  # (type, minor, VF bus id)
    exclusive_cpus: int = 0  # pinned by kubelet's static CPU manager (request/usage.py)
    whole_cards: bool = False  # its devices are whole-card IDs to kubelet (nvidia.com/gpu), not shares
    koord_shares: bool = False  # its shares are Koordinator's own IDs to kubelet (koordinator.sh/gpu)


def _usage_of(allocations: DeviceAllocations | None) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    used = []
    vfs = []
    if allocations is not None:
        for dtype, entries in allocations.by_type.items():
            for entry in entries:
                res = tuple(sorted((n, q.value()) for n, q in (entry.resources or {}).items()))
                used.append((dtype, entry.minor, res))
                vfs.extend((dtype, entry.minor, vf.bus_id) for vf in entry.vfs)
    return tuple(used), tuple(vfs)


def node_facts(node: Mapping[str, Any]) -> tuple[str, dict[str, str], dict[str, int]]:
    """Name, labels and allocatable (cpu in milli-cores, everything else in whole units) of a Node.

    Raises CodecError on a malformed allocatable quantity.
    """
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    allocatable: dict[str, int] = {}
    for name, value in (status.get("allocatable") or {}).items():
        qty = Quantity.parse(value, f"status.allocatable.{name}")
        allocatable[name] = qty.milli_value() if name == rn.CPU else qty.value()
    return str(meta.get("name", "")), dict(meta.get("labels") or {}), allocatable


class NodeState:
    """Mutable; every change bumps `version`, which keys all caches built on this node."""

    def __init__(
        self,
        name: str,
        inventory: NodeInventory | None = None,
        labels: Mapping[str, str] | None = None,
        allocatable: Mapping[str, int] | None = None,
    ) -> None:
        self.name = name
        self.labels: dict[str, str] = dict(labels or {})
        self.allocatable: dict[str, int] = dict(allocatable or {})
        self.version = 0
        self.pods: dict[str, PodEntry] = {}
        self.claim_entries = 0  # entries of ResourceClaims among `pods` (not pods)
        self.used: dict[str, dict[int, dict[str, int]]] = {}
        self.vf_taken: dict[str, dict[int, set[str]]] = {}
        self.requested_cpu_milli = 0
        self.requested_memory = 0
        self.nonzero_cpu_milli = 0
        self.nonzero_memory = 0
        self.inventory: NodeInventory | None = None
        self.resource_kinds: frozenset[str] = frozenset()  # cpu, memory, gpu, rdma, ... offered here
        self.allocatable_cpu_milli = self.allocatable_memory = 0
        self.free: dict[str, dict[int, dict[str, int]]] = {}
        self.summaries: dict[str, DeviceSummary] = {}  # device type -> its summary of this node
        # The ClusterState's node table and this node's slot there: every change stamps the slot,
        # which is how the cluster's column caches (filter verdicts, scores) see it.
        self._table: ChangeLog | None = None
        self._slot = -1
        self.set_inventory(inventory)

    @classmethod
    def from_node(cls, node: Mapping[str, Any], inventory: NodeInventory | None = None) -> NodeState:
        name, labels, allocatable = node_facts(node)
        return cls(name, inventory, labels, allocatable)

    # -- changes -------------------------------------------------------------------------------
    def set_inventory(self, inventory: NodeInventory | None) -> None:
        """A Device add/update: recompute every device's free resources from the pods kept here."""
        self.inventory = inventory
        self.free = {}
        minors: dict[str, set[int]] = {}
        if inventory is not None:
            for dtype, slots in inventory.devices.items():
                minors.setdefault(dtype, set()).update(s.minor for s in slots)
        for dtype, per_minor in self.used.items():
            minors.setdefault(dtype, set()).update(per_minor)
        self.summaries = {dtype: make(inventory) for dtype, make in SUMMARIES.items()}
        for dtype, ms in minors.items():
            for minor in ms:
                self._refresh(dtype, minor)
        self._refresh_kinds()
        self._changed()

    def set_labels(self, labels: Mapping[str, str], allocatable: Mapping[str, int] | None = None) -> None:
        self.labels = dict(labels)
        if allocatable is not None:
            self.allocatable = dict(allocatable)
        self._refresh_kinds()
        self._changed()

    def _refresh_kinds(self) -> None:
        kinds = {rn.RESOURCE_DEVICE_TYPE.get(n, n) for n, v in self.allocatable.items() if v > 0}
        kinds.discard(rn.PODS)
        if self.inventory is not None:
            kinds.update(t for t, slots in self.inventory.devices.items() if any(s.total for s in slots))
        self.resource_kinds = frozenset(str(k) for k in kinds)
        self.allocatable_cpu_milli = self.allocatable.get(rn.CPU, 0)
        self.allocatable_memory = self.allocatable.get(rn.MEMORY, 0)

    def add_pod(
        self,
        key: str,
        allocations: DeviceAllocations | None,
        cpu_milli: int = 0,
        memory: int = 0,
        *,
        nonzero_cpu_milli: int | None = None,
        nonzero_memory: int | None = None,
        exclusive_cpus: int = 0,
        whole_cards: bool = False,
        koord_shares: bool = False,
    ) -> None:
        """Count a pod's devices and requests here. Adding a key again replaces its old entry."""
        if key in self.pods:
            self._drop(self.pods.pop(key))
        elif key.startswith(CLAIM_KEY_PREFIX):
            self.claim_entries += 1
        used, vfs = _usage_of(allocations)
        entry = PodEntry(
            key,
            allocations,
            cpu_milli,
            memory,
            cpu_milli if nonzero_cpu_milli is None else nonzero_cpu_milli,
            memory if nonzero_memory is None else nonzero_memory,
            used,
            vfs,
            exclusive_cpus,
            whole_cards,
            koord_shares,
        )
        self.pods[key] = entry
        for dtype, minor, res in used:
            slot = self.used.setdefault(dtype, {}).setdefault(minor, {})
            for name, value in res:
                slot[name] = slot.get(name, 0) + value
            self._refresh(dtype, minor)
        for dtype, minor, bus in vfs:
            self.vf_taken.setdefault(dtype, {}).setdefault(minor, set()).add(bus)
        self.requested_cpu_milli += entry.cpu_milli
        self.requested_memory += entry.memory
        self.nonzero_cpu_milli += entry.nonzero_cpu_milli
        self.nonzero_memory += entry.nonzero_memory
        self._changed()

    def add_usage(self, usage: PodUsage | PodEntry) -> None:
        """Count a bound pod's recorded usage, or re-add an entry taken from a NodeState."""
        self.add_pod(
            usage.key,
            usage.allocations,
            usage.cpu_milli,
            usage.memory,
            nonzero_cpu_milli=usage.nonzero_cpu_milli,
            nonzero_memory=usage.nonzero_memory,
            exclusive_cpus=usage.exclusive_cpus,
            whole_cards=usage.whole_cards,
            koord_shares=usage.koord_shares,
        )

    def rekey(self, old: str, new: str) -> bool:
        """Count `old`'s entry under `new`, nothing else changed: no column is refreshed. False
        (nothing done) unless `old` is here and `new` is not, and neither is a claim's or a room's
        key (those are counted apart: `claim_entries`, kubelet's view)."""
        special = (CLAIM_KEY_PREFIX, ROOM_KEY_PREFIX)
        if new in self.pods or old.startswith(special) or new.startswith(special):
            return False
        entry = self.pods.pop(old, None)
        if entry is None:
            return False
        self.pods[new] = replace(entry, key=new)
        return True

    def remove_pod(self, key: str) -> bool:
        entry = self.pods.pop(key, None)
        if entry is None:
            return False
        if key.startswith(CLAIM_KEY_PREFIX):
            self.claim_entries -= 1
        self._drop(entry)
        self._changed()
        return True

    def _drop(self, entry: PodEntry) -> None:
        for dtype, minor, res in entry.used:
            slot = self.used.get(dtype, {}).get(minor)
            if slot is None:
                continue
            for name, value in res:
                left = slot.get(name, 0) - value
                if left > 0:
                    slot[name] = left
                else:
                    slot.pop(name, None)
            if not slot:
                del self.used[dtype][minor]
            self._refresh(dtype, minor)
        for dtype, minor, bus in entry.vfs:
            taken = self.vf_taken.get(dtype, {}).get(minor)
            if taken is not None:
                taken.discard(bus)
        self.requested_cpu_milli -= entry.cpu_milli
        self.requested_memory -= entry.memory
        self.nonzero_cpu_milli -= entry.nonzero_cpu_milli
        self.nonzero_memory -= entry.nonzero_memory

    def _refresh(self, dtype: str, minor: int) -> None:
        inv = self.inventory
        slot = inv.slot(dtype, minor) if inv is not None else None
        total = slot.total if slot is not None else {}
        used = self.used.get(dtype, {}).get(minor, {})
        free = {n: max(v - used.get(n, 0), 0) for n, v in total.items()}
        for n in used:
            free.setdefault(n, 0)
        per_type = self.free.setdefault(dtype, {})
        summary = self.summaries.get(dtype)
        if summary is not None:
            summary.update(minor, total, used, free, per_type.get(minor))
        per_type[minor] = free

    def _changed(self) -> None:
        self.version += 1
        if self._table is not None:
            self._table.touch(self._slot)

    @property
    def table(self) -> ChangeLog | None:
        """The node table of the ClusterState this node belongs to (None: standalone)."""
        return self._table

    def attach(self, table: ChangeLog | None, slot: int) -> None:
        """Report every change to `table` as a change of `slot` (None: to no table)."""
        self._table, self._slot = table, slot

    def devices_gone(self) -> None:
        """The Device CR was deleted: every device counts as unhealthy until it returns (2.2)."""
        if self.inventory is not None:
            self.set_inventory(all_unhealthy(self.inventory))

    # -- summaries -----------------------------------------------------------------------------
    def forget_derived(self) -> None:
        """Drop what the summaries derived and cached (benchmarks measure cold caches this way)."""
        for summary in self.summaries.values():
            summary.forget()

    # Kept while allocator/gang reads it (issue 25); the core reads the type's summary.
    whole_gpus_free = property(whole_gpus_free)

    @property
    def cpu_free_milli(self) -> int:
        return self.allocatable.get(rn.CPU, 0) - self.requested_cpu_milli

    @property
    def memory_free(self) -> int:
        return self.allocatable.get(rn.MEMORY, 0) - self.requested_memory

    @property
    def pod_count(self) -> int:
        return len(self.pods) - self.claim_entries

    def has_free(self, allocations: DeviceAllocations) -> bool:
        """Whether every device, share and VF of `allocations` is free here now (a recorded
        allocation held again, e.g. by a new leader)."""
        used, vfs = _usage_of(allocations)
        for dtype, minor, res in used:
            free = self.free.get(dtype, {}).get(minor)
            if free is None or any(free.get(name, 0) < value for name, value in res):
                return False
        return all(bus not in self.vf_taken.get(dtype, {}).get(minor, ()) for dtype, minor, bus in vfs)

    def free_vfs(self, dtype: str, minor: int) -> int:
        inv = self.inventory
        slot = inv.slot(dtype, minor) if inv is not None else None
        if slot is None:
            return 0
        taken = self.vf_taken.get(dtype, {}).get(minor, ())
        return sum(1 for vf in slot.vfs if vf.bus_id not in taken)


def state_from_objects(
    node: Mapping[str, Any] | None,
    device: Mapping[str, Any] | None,
    pods: list[Mapping[str, Any]] | tuple[Mapping[str, Any], ...] = (),
) -> NodeState:
    """A NodeState from raw objects (Node, Device, bound Pods). Raises CodecError on a Device or Node
    that does not decode; pods with unparsable annotations count as using no devices."""
    labels = None
    name, allocatable = "", {}
    if node is not None:
        name, labels, allocatable = node_facts(node)
    inv = build_inventory(device, labels) if device is not None else None
    if not name and inv is not None:
        name = inv.name
    if labels is None and inv is not None:
        labels = dict(inv.labels)  # the slo-controller copies Device labels to the Node
    state = NodeState(name, inv, labels, allocatable)
    for pod in pods:
        usage = pod_usage(pod)
        state.add_usage(usage)
    return state
