"""One node's live state: its inventory plus what the pods on it use, with summaries kept up to date.

`add_pod` / `remove_pod` touch only the devices named in the pod's allocation and bump `version`.
Summaries the allocator and scorers read in O(1): free resources per device, GPUs in use, GPUs
that can take a whole-card request, free GPU share, requested cpu/memory. Derived per-version
values (feasible-GPU masks per request shape) are computed on first use and dropped on change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Protocol

from allocator.core.node.inventory import NodeInventory, build_inventory, summed_totals
from allocator.core.request.pod_request import WHOLE_GPU, Resources
from allocator.core.request.usage import PodUsage, pod_usage
from apis import keys
from apis import resources as rn
from apis.annotations import DeviceAllocations
from apis.quantity import Quantity

GPU = rn.DeviceType.GPU


class ChangeLog(Protocol):
    """Where a node reports its changes: the node table (`node.table.NodeTable`) of the ClusterState
    it belongs to. A Protocol, so this module never imports the table, which reads NodeStates."""

    def touch(self, slot: int) -> None: ...


def fits_free(request: Resources, free: Mapping[str, int]) -> bool:
    """Koordinator's `request <= free`: only names the device reports are compared."""
    for name, value in request:
        have = free.get(name)
        if have is not None and value > have:
            return False
    return True


def all_zero(free: Mapping[str, int]) -> bool:
    return not any(free.values())


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
    gpu_whole: bool = False  # its GPUs are nvidia.com/gpu IDs to kubelet, not gpu-core shares


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
        self.gpu_used_mask = 0
        self.gpu_whole_mask = 0
        # Free and total GPU memory share over healthy GPUs, in percent of one GPU (800 = 8 GPUs).
        self.gpu_free_ratio = 0
        self.gpu_total_ratio = 0
        self._gpu_shares: dict[int, int] = {}
        self._gpu_pct: dict[int, int] = {}  # minor -> free share in percent (gpu_free_core_pct)
        # The largest min(free gpu-core, free gpu-memory-ratio) of any healthy GPU (-1: none).
        self.gpu_max_share = -1
        self._derived: dict[Any, Any] = {}
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
        self.gpu_used_mask = self.gpu_whole_mask = self.gpu_free_ratio = 0
        self._gpu_shares = {}
        self._gpu_pct = {}
        for dtype, ms in minors.items():
            for minor in ms:
                self._refresh(dtype, minor)
        self.gpu_total_ratio = (
            0 if inventory is None else inventory.type_totals.get(GPU, {}).get(rn.GPU_MEMORY_RATIO, 0)
        )
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
        gpu_whole: bool = False,
    ) -> None:
        """Count a pod's devices and requests here. Adding a key again replaces its old entry."""
        if key in self.pods:
            self._drop(self.pods.pop(key))
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
            gpu_whole,
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
            gpu_whole=usage.gpu_whole,
        )

    def remove_pod(self, key: str) -> bool:
        entry = self.pods.pop(key, None)
        if entry is None:
            return False
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
        if dtype == GPU:
            bit = 1 << minor
            old = per_type.get(minor)
            if old is not None and total:
                self.gpu_free_ratio -= old.get(rn.GPU_MEMORY_RATIO, 0)
            if total:
                self.gpu_free_ratio += free.get(rn.GPU_MEMORY_RATIO, 0)
            if any(used.values()):
                self.gpu_used_mask |= bit
            else:
                self.gpu_used_mask &= ~bit
            if total and not all_zero(free) and fits_free(WHOLE_GPU, free):
                self.gpu_whole_mask |= bit
            else:
                self.gpu_whole_mask &= ~bit
            shares = [free[n] for n in (rn.GPU_CORE, rn.GPU_MEMORY_RATIO) if n in free]
            if total and shares and not all_zero(free):
                self._gpu_shares[minor] = min(shares)
            else:
                self._gpu_shares.pop(minor, None)
            self.gpu_max_share = max(self._gpu_shares.values(), default=-1)
            pct = [
                free.get(n, 0) * 100 // total[n] for n in (rn.GPU_CORE, rn.GPU_MEMORY_RATIO) if total.get(n)
            ]
            self._gpu_pct[minor] = max(0, min(100, min(pct))) if pct else 0
        per_type[minor] = free

    def _changed(self) -> None:
        self.version += 1
        if self._derived:
            self._derived = {}
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
        inv = self.inventory
        if inv is None:
            return
        dead = {
            t: tuple(replace(s, health=False, total=MappingProxyType({})) for s in slots)
            for t, slots in inv.devices.items()
        }
        by_minor = {t: MappingProxyType({s.minor: s for s in slots}) for t, slots in dead.items()}
        self.set_inventory(
            replace(
                inv,
                devices=MappingProxyType(dead),
                by_minor=MappingProxyType(by_minor),
                gpu_healthy_mask=0,
                type_totals=summed_totals(dead),
                gpu_memory_size=0,
            )
        )

    # -- summaries -----------------------------------------------------------------------------
    def derived(self, key: Any) -> Any:
        return self._derived.get(key)

    def remember(self, key: Any, value: Any) -> Any:
        self._derived[key] = value
        return value

    def gpu_fit_mask(self, per_gpu: Resources) -> int:
        """GPUs that can take `per_gpu` now: healthy, not exhausted, and `per_gpu <= free`."""
        if per_gpu == WHOLE_GPU:
            return self.gpu_whole_mask
        key = ("fit", per_gpu)
        hit = self._derived.get(key)
        if hit is not None:
            return hit
        mask = 0
        inv = self.inventory
        if inv is not None:
            frees = self.free.get(GPU, {})
            healthy = inv.gpu_healthy_mask
            for minor in inv.gpu_minors:
                free = frees.get(minor)
                if healthy >> minor & 1 and free and not all_zero(free) and fits_free(per_gpu, free):
                    mask |= 1 << minor
        self._derived[key] = mask
        return mask

    def largest_free_set(self, level: int, per_gpu: Resources = WHOLE_GPU) -> tuple[int, str]:
        """The most GPUs that can take `per_gpu` inside one scope of `level` (inventory.LEVEL_*)
        and that scope's name; (0, "") without such scopes."""
        key = ("largest", level, per_gpu)
        hit = self._derived.get(key)
        if hit is not None:
            return hit
        best, name = 0, ""
        inv = self.inventory
        if inv is not None:
            feasible = self.gpu_fit_mask(per_gpu)
            for scope in inv.scopes_by_level.get(level, ()):
                n = (feasible & scope.mask).bit_count()
                if n > best:
                    best, name = n, scope.name
        return self.remember(key, (best, name))

    @property
    def whole_gpus_free(self) -> int:
        return self.gpu_whole_mask.bit_count()

    @property
    def healthy_gpu_count(self) -> int:
        return 0 if self.inventory is None else self.inventory.gpu_healthy_mask.bit_count()

    @property
    def gpu_model(self) -> str:
        """Node label first (what kube-scheduler sees), the Device label otherwise."""
        model = self.labels.get(keys.GPU_MODEL)
        if model:
            return model
        return self.inventory.gpu_model if self.inventory is not None else ""

    @property
    def gpu_free_core_pct(self) -> tuple[int, ...]:
        """Free compute share of each GPU in percent (0..100), GPUs in minor order; an unhealthy GPU
        has 0. A GPU's share is the smaller of its free compute and free memory share, since a
        shared task needs both."""
        hit = self._derived.get("free_pct")
        if hit is not None:
            return hit
        inv = self.inventory
        pct = self._gpu_pct
        out = () if inv is None else tuple(pct.get(m, 0) for m in inv.gpu_minors)
        return self.remember("free_pct", out)

    @property
    def cpu_free_milli(self) -> int:
        return self.allocatable.get(rn.CPU, 0) - self.requested_cpu_milli

    @property
    def memory_free(self) -> int:
        return self.allocatable.get(rn.MEMORY, 0) - self.requested_memory

    @property
    def pod_count(self) -> int:
        return len(self.pods)

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
