"""The devices the agent chooses for a pod that reached this node without an allocation for it.

A pod bound here with no `device-allocated` annotation (the admission webhook was down and failed
open, the pod was bound before topoalloc was installed, a scheduler that knows nothing of topoalloc
bound it), or with one made for another node (its `allocated-node` names another node: kube-scheduler
bound it elsewhere than where it was placed), gets its devices from this node's free ones by the
agent's own journal (what it served and has not seen finish), chosen by topology (gpu_choice.py):

* GPUs: whole GPUs as the best set; shares on the GPU whose free share fits best;
* RDMA NICs: with `device-joint-allocate` naming GPUs and RDMA, next to the pod's GPUs (the GPUs
  chosen where a NIC for the pod sits behind their switch; with `SamePCIe` one NIC on each switch
  of the GPUs, or none); otherwise the free NIC closest to the pod's GPUs. With a `vfSelector` hint
  each NIC comes with its lowest free VF of a matching group.

Devices annotated to another pod of this node that kubelet has not admitted yet are taken only
when nothing else fits. The answer is the pod's allocation in Koordinator's format, per container,
so the annotation the agent then writes is what the allocator would have written.

Pure: what the pod asks, the inventory and the node's use in, a `Plan` out; NoRoom says why not.
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from dataclasses import dataclass, field

from agent.deviceplugin.expectation import ExpectationError
from agent.deviceplugin.gpu_choice import best_fit, best_set
from agent.deviceplugin.inventory import GpuDev, Inventory, NicDev, base_of
from agent.deviceplugin.node_request import GPU, RDMA, GpuAsk, NicAsk, PodAsk
from apis import resources as rn
from apis.annotations import AllocatedVF, DeviceAllocation, DeviceAllocations
from apis.interconnect import GpuPlace, host_tier
from apis.quantity import Format, Quantity


class NoRoom(ExpectationError):
    """What the pod asks cannot be served on this node now; the message says why."""


@dataclass
class NodeUse:
    """What this node's devices hold: percent of each GPU's compute and memory, units of each NIC,
    the VFs in use, and (soft) the devices annotated to pods kubelet has not admitted yet."""

    core: dict[int, int] = field(default_factory=dict)  # GPU minor ->
    ratio: dict[int, int] = field(default_factory=dict)  # GPU minor ->
    nic: dict[int, int] = field(default_factory=dict)  # NIC minor -> units
    vfs: set[str] = field(default_factory=set)
    awaited_gpus: set[int] = field(default_factory=set)
    awaited_nics: set[int] = field(default_factory=set)

    def free_gpu(self, minor: int) -> tuple[int, int]:
        return (100 - self.core.get(minor, 0), 100 - self.ratio.get(minor, 0))

    def add(self, inv: Inventory, allocated: DeviceAllocations) -> None:
        """Count an allocation's entries (one this pod holds, or one just planned)."""
        for e in allocated[GPU]:
            gpu = inv.gpu_by_minor(e.minor)
            core, ratio = _gpu_amounts(e, gpu)
            self.core[e.minor] = self.core.get(e.minor, 0) + core
            self.ratio[e.minor] = self.ratio.get(e.minor, 0) + ratio
        for e in allocated[RDMA]:
            units = (e.resources or {}).get(rn.RDMA)
            self.nic[e.minor] = self.nic.get(e.minor, 0) + (units.value() if units is not None else 100)
            self.vfs.update(vf.bus_id for vf in e.vfs)

    def add_held(
        self, inv: Inventory, resources: dict[str, list[list[str]]], allocated: DeviceAllocations | None
    ) -> None:
        """Count what one served pod holds: kubelet's IDs, and from its allocation (when known) the
        memory shares and VFs the IDs do not tell."""
        ratios: dict[int, int] = {}
        if allocated is not None:
            for e in allocated[GPU]:
                ratios[e.minor] = ratios.get(e.minor, 0) + _gpu_amounts(e, inv.gpu_by_minor(e.minor))[1]
            self.vfs.update(vf.bus_id for e in allocated[RDMA] for vf in e.vfs)
        for resource, per_container in resources.items():
            counts: dict[str, int] = {}
            for device_id in (i for ids in per_container for i in ids):
                base = base_of(resource, device_id)
                counts[base] = counts.get(base, 0) + 1
            for base, n in counts.items():
                if resource == rn.RDMA:
                    nic = next((x for x in inv.nics if x.pf == base), None)
                    if nic is not None:
                        self.nic[nic.minor] = self.nic.get(nic.minor, 0) + n
                    continue
                gpu = inv.gpu_by_uuid(base)
                if gpu is None:
                    continue
                core = 100 if resource == rn.NVIDIA_GPU else n
                self.core[gpu.minor] = self.core.get(gpu.minor, 0) + core
                ratio = 100 if resource == rn.NVIDIA_GPU else ratios.get(gpu.minor, core)
                self.ratio[gpu.minor] = self.ratio.get(gpu.minor, 0) + ratio


def _gpu_amounts(e: DeviceAllocation, gpu: GpuDev | None) -> tuple[int, int]:
    res = e.resources or {}
    core = res[rn.GPU_CORE].value() if rn.GPU_CORE in res else 100
    if rn.GPU_MEMORY_RATIO in res:
        return core, res[rn.GPU_MEMORY_RATIO].value()
    if rn.GPU_MEMORY in res and gpu is not None and gpu.memory:
        return core, res[rn.GPU_MEMORY].value() * 100 // gpu.memory
    return core, core


@dataclass
class Plan:
    """The pod's allocation per container: `gpu[i]` the entries of the i-th container asking a GPU
    resource, `rdma[j]` of the j-th asking RDMA."""

    gpu: list[list[DeviceAllocation]]
    rdma: list[list[DeviceAllocation]]

    def allocations(self) -> DeviceAllocations:
        by_type = {GPU: [e for c in self.gpu for e in c], RDMA: [e for c in self.rdma for e in c]}
        return DeviceAllocations({t: v for t, v in by_type.items() if v})


@dataclass(frozen=True)
class Offered:
    """What kubelet offers one container of the pod: available IDs per base device."""

    resource: str
    container: int
    units: dict[str, int]


def _place(g: GpuDev | NicDev) -> GpuPlace:
    return GpuPlace(
        minor=-1,
        numa=g.numa,
        socket=g.place.socket,
        pcie_root=g.place.pcie_root,
        pcie_switch=g.place.pcie_switch,
    )


def gpu_entry(gpu: GpuDev, ask: GpuAsk) -> DeviceAllocation:
    """An annotation entry as the allocator writes it (Koordinator's fillGPUTotalMem)."""
    res = {rn.GPU_CORE: Quantity.of(ask.core)}
    if ask.ratio is not None:
        res[rn.GPU_MEMORY_RATIO] = Quantity.of(ask.ratio)
        res[rn.GPU_MEMORY] = Quantity.of(gpu.memory * ask.ratio // 100, Format.BINARY_SI)
    else:
        memory = ask.memory or 0
        res[rn.GPU_MEMORY] = Quantity.of(memory, Format.BINARY_SI)
        res[rn.GPU_MEMORY_RATIO] = Quantity.of(memory * 100 // gpu.memory if gpu.memory else 0)
    return DeviceAllocation(gpu.minor, res, id=gpu.uuid)


class _Planner:
    def __init__(self, ask: PodAsk, inv: Inventory, use: NodeUse, offered: Offered | None) -> None:
        self.ask, self.inv, self.use, self.offered = ask, inv, use, offered

    def _offered(self, resource: str, container: int, base: str, need: int) -> bool:
        o = self.offered
        if o is None or o.resource != resource or o.container != container:
            return True
        return o.units.get(base, 0) >= need

    def gpus(
        self, i: int, ask: GpuAsk, taken: Collection[int], nic_scopes: set[str] | None
    ) -> list[DeviceAllocation]:
        resource = self.ask.gpu_resource
        sel = self.ask.gpu_selector
        ok = [
            g
            for g in self.inv.gpus
            if g.healthy
            and g.minor not in taken
            and (sel is None or sel.matches(g.place.labels))
            and self._offered(resource, i, g.uuid, 1 if resource == rn.NVIDIA_GPU else ask.core)
        ]
        need_ratio = ask.ratio if ask.ratio is not None else -1
        for avoid in (self.use.awaited_gpus, set()):
            cands = {g.minor: g for g in ok if g.minor not in avoid}
            if ask.whole:
                free = [m for m in cands if self.use.free_gpu(m) == (100, 100)]
                pool = [
                    g.minor for g in self.inv.gpus if g.healthy and self.use.free_gpu(g.minor) == (100, 100)
                ]
                used = [g.minor for g in self.inv.gpus if self.use.free_gpu(g.minor) != (100, 100)]
                near = (
                    None
                    if nic_scopes is None
                    else {m for m in free if cands[m].place.pcie_scope in nic_scopes}
                )
                scopes = {g.minor: _scopes(g) for g in self.inv.gpus}
                chosen = best_set(
                    self.inv.interconnect, free, ask.count, pool=pool, used=used, near_nic=near, scopes=scopes
                )
            else:
                free_share = {m: self.use.free_gpu(m) for m in cands}
                ratio = need_ratio if need_ratio >= 0 else _memory_ratio(ask, cands)
                chosen = best_fit(free_share, ask.core, ratio, ask.count)
            if chosen:
                return [gpu_entry(cands[m], ask) for m in chosen]
        raise NoRoom(self._no_gpu(ask, ok))

    def _no_gpu(self, ask: GpuAsk, ok: list[GpuDev]) -> str:
        what = f"{ask.count} whole GPU{'s' if ask.count > 1 else ''}"
        if not ask.whole:
            memory = f"{ask.ratio} % memory" if ask.ratio is not None else f"{ask.memory} bytes of memory"
            what = f"{ask.count} × ({ask.core} % compute, {memory})"
        free = ", ".join(
            f"GPU {g.minor} {self.use.free_gpu(g.minor)[0]} %/{self.use.free_gpu(g.minor)[1]} %"
            for g in ok
            if self.use.free_gpu(g.minor) != (0, 0)
        )
        return f"container {ask.container!r} asks {what}; free here: {free or 'no GPU'}"

    def nics(
        self, j: int, ask: NicAsk, taken: Collection[int], gpus: list[GpuDev], same_pcie: bool
    ) -> list[DeviceAllocation]:
        sel, vf_sel = self.ask.nic_selector, self.ask.vf_selector
        ok: list[tuple[NicDev, str]] = []
        for n in self.inv.nics:
            if not n.healthy or n.minor in taken or 100 - self.use.nic.get(n.minor, 0) < ask.units:
                continue
            if (sel is not None and not sel.matches(n.place.labels)) or not self._offered(
                rn.RDMA, j, n.pf, ask.units
            ):
                continue
            vf = ""
            if vf_sel is not None:
                free = sorted(
                    v
                    for grp in n.vf_groups
                    if vf_sel.matches(grp.labels)
                    for v in grp.vfs
                    if v not in self.use.vfs
                )
                if not free:
                    continue
                vf = free[0]
            ok.append((n, vf))

        def rank(item: tuple[NicDev, str]) -> tuple[int, int, int, int]:
            n = item[0]
            near = max((host_tier(_place(n), _place(g)) for g in gpus), default=0)
            return (-near, n.minor in self.use.awaited_nics, 100 - self.use.nic.get(n.minor, 0), n.minor)

        ok.sort(key=rank)
        chosen: list[tuple[NicDev, str]] = []
        if same_pcie:
            for scope in dict.fromkeys(g.place.pcie_scope for g in gpus):
                hit = next((x for x in ok if x[0].place.pcie_scope == scope and x not in chosen), None)
                if hit is None:
                    raise NoRoom(
                        f"container {ask.container!r} asks an RDMA NIC on each PCIe switch of its GPUs "
                        f"(SamePCIe); none is free on {scope}"
                    )
                chosen.append(hit)
        chosen += [x for x in ok if x not in chosen][: max(0, ask.count - len(chosen))]
        if len(chosen) < ask.count:
            vf = " with a free VF" if vf_sel is not None else ""
            raise NoRoom(
                f"container {ask.container!r} asks {ask.count} RDMA NIC(s) with {ask.units} units{vf}; "
                f"{len(ok)} can take it here"
            )
        return [_nic_entry(n, ask.units, vf) for n, vf in chosen]


def _nic_entry(nic: NicDev, units: int, vf: str) -> DeviceAllocation:
    entry = DeviceAllocation(nic.minor, {rn.RDMA: Quantity.of(units)}, id=nic.pf)
    if vf:
        entry.vfs = [AllocatedVF(-1, vf)]  # -1: as koordlet writes a VF's minor
    return entry


def _scopes(g: GpuDev) -> tuple[str, ...]:
    return (f"numa:{g.numa}", f"switch:{g.place.pcie_switch}", f"root:{g.place.pcie_root}")


def _memory_ratio(ask: GpuAsk, gpus: dict[int, GpuDev]) -> int:
    sizes = [g.memory for g in gpus.values() if g.memory]
    return -(-(ask.memory or 0) * 100 // min(sizes)) if sizes else 0


def plan_pod(
    ask: PodAsk,
    inv: Inventory,
    use: NodeUse,
    fixed: dict[tuple[str, int], list[DeviceAllocation]],
    offered: Offered | None = None,
) -> Plan:
    """The pod's devices: `fixed` (what its containers were already served, by (resource,
    container)) kept, the rest chosen. `use`: the node's use by other pods. Raises NoRoom."""
    use = copy.deepcopy(use)
    gpus: list[list[DeviceAllocation] | None] = [
        fixed.get((ask.gpu_resource, i)) for i in range(len(ask.gpus))
    ]
    nics: list[list[DeviceAllocation] | None] = [fixed.get((rn.RDMA, j)) for j in range(len(ask.nics))]
    for (resource, _), entries in fixed.items():
        use.add(inv, DeviceAllocations({RDMA if resource == rn.RDMA else GPU: entries}))
    planner = _Planner(ask, inv, use, offered)
    joint = RDMA in ask.joint and GPU in ask.joint

    def own_gpus() -> list[GpuDev]:
        return [g for c in gpus if c for e in c if (g := inv.gpu_by_minor(e.minor)) is not None]

    def own_nic_scopes() -> set[str]:
        return {
            n.place.pcie_scope for c in nics if c for e in c if (n := inv.nic_by_minor(e.minor)) is not None
        }

    def choose_gpus() -> None:
        nic_scopes = None
        if joint:
            units = min(a.units for a in ask.nics)
            nic_scopes = own_nic_scopes() or {
                n.place.pcie_scope
                for n in inv.nics
                if n.healthy
                and 100 - use.nic.get(n.minor, 0) >= units
                and (ask.nic_selector is None or ask.nic_selector.matches(n.place.labels))
            }
        for i, a in enumerate(ask.gpus):
            if gpus[i] is None:
                taken = {g.minor for g in own_gpus()}
                gpus[i] = planner.gpus(i, a, taken, nic_scopes)
                use.add(inv, DeviceAllocations({GPU: gpus[i] or []}))

    def choose_nics() -> None:
        for j, a in enumerate(ask.nics):
            if nics[j] is None:
                taken = {e.minor for c in nics if c for e in c}
                nics[j] = planner.nics(j, a, taken, own_gpus(), ask.same_pcie and bool(own_gpus()))
                use.add(inv, DeviceAllocations({RDMA: nics[j] or []}))

    for step in (choose_nics, choose_gpus) if ask.joint[:1] == (RDMA,) else (choose_gpus, choose_nics):
        step()
    return Plan([c or [] for c in gpus], [c or [] for c in nics])
