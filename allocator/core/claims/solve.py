"""The devices for a pod's claims on one node, or why not.

The candidates of each request are the node's published devices that pass its class's and its own
CEL selectors and carry the attributes its constraints name; the core's device choice
(`devices.allocate`: NVLink-optimal GPU sets, partitions, the scope walk, joint NIC pairing) runs
bounded to them. Its answer is handed out to the requests (`assign`), which checks every constraint
on the published attributes. Where the core has no notion of a constraint, more tries follow: the
GPUs of one value of a regrouped attribute at a time (best fit first), and for GPU-NIC pairs the
GPUs capped per switch to the NICs there. An answer that fails the check is never returned.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from allocator.core import reasons as rs
from allocator.core.claims.assign import assign
from allocator.core.claims.published import (
    GPU,
    RDMA,
    NodeDevices,
    device_name,
    sharable_gpus,
    share_allocation,
    vf_allocation,
    vf_index,
    vf_of,
)
from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.devices.context import Bounds
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.inventory import VF, NodeInventory
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.cel import PublishedDevice, SelectorError
from allocator.core.request.claims import CLAIM_SELECTOR, ClaimsRequest
from allocator.core.scoring.device import DeviceScoring
from apis import dra
from apis import resources as rn
from apis.annotations import DeviceAllocation, DeviceAllocations
from apis.dra_capacity import consumed
from apis.dra_claims import DeviceResult
from apis.dra_taints import blocking
from apis.quantity import Quantity

NOT_PUBLISHED = "topoalloc: no ResourceSlice"
WHOLE_ONLY = "topoalloc: GPUs whole only"
NO_CANDIDATES = "topoalloc: too few matching devices"
CONSTRAINTS = "topoalloc: claim constraints unmet"

_NOUN = {dra.TYPE_GPU: "GPUs", dra.TYPE_RDMA: "RDMA NICs", dra.TYPE_RDMA_VF: "RDMA VFs"}


@dataclass(frozen=True)
class ClaimAnswer:
    """The node chosen for a pod's claims and each claim's results and usage there."""

    node: str
    pool: str
    results: Mapping[str, tuple[DeviceResult, ...]]  # claim key -> its results
    usage: Mapping[str, DeviceAllocations]  # claim key -> what it takes on the node
    notes: tuple[str, ...] = ()


def solve(
    state: NodeState,
    creq: ClaimsRequest,
    published: NodeDevices | None,
    *,
    scoring: DeviceScoring | None = None,
    explain: list[str] | None = None,
) -> ClaimAnswer | Rejection:
    inv = state.inventory
    if inv is None:
        return Rejection(
            rs.NO_DEVICE_CR, "node has no Device resource, so its GPUs and NICs are unknown", True
        )
    if published is None or not published.devices:
        return Rejection(
            NOT_PUBLISHED, "node publishes no topoalloc.io devices (no complete ResourceSlice pool)"
        )
    try:
        cands = _candidates(creq, published.devices, state)
    except SelectorError as exc:
        return Rejection(CLAIM_SELECTOR, str(exc), True)
    missing = _missing_attribute(creq, published.devices) or _whole_only(creq, published.devices)
    if missing is not None:
        return missing
    for kind, noun in _NOUN.items():
        need = creq.count(kind)
        have = len(frozenset().union(*(c for c, s in zip(cands, creq.slots, strict=True) if s.kind == kind)))
        if need > have:
            return Rejection(
                NO_CANDIDATES,
                f"need {need} {noun} that are published, free and pass the claims' selectors and constraints",
                detail=f"{have} are" + _tainted(creq, kind, published.devices),
            )
    notes: list[str] | None = [] if explain is not None else None
    last: Rejection | None = None
    for label, bounds in _attempts(creq, cands, inv, state, published.devices):
        if notes is not None and label:
            notes.append(label)
        got = allocate(state, creq.pod, scoring=scoring, required=bounds, explain=notes)
        if isinstance(got, Rejection):
            last = last or got
            continue
        answer = _answer(state, inv, creq, cands, published, got, notes)
        if answer is not None:
            if explain is not None:
                explain.extend(notes or ())
            return answer
        last = Rejection(CONSTRAINTS, "no hand-out of the chosen devices meets the claims' constraints")
    if explain is not None:
        explain.extend(notes or ())
    assert last is not None
    return last


# -- candidates and bounds ---------------------------------------------------------------------------


def _candidates(
    creq: ClaimsRequest, devices: Mapping[str, PublishedDevice], state: NodeState
) -> list[frozenset[str]]:
    """Per request slot, the published devices of its kind that pass its selectors, carry its
    constraints' attributes, bear no taint it does not tolerate (NoSchedule, NoExecute: as
    kube-scheduler) and (VFs) are free."""
    inv = state.inventory
    assert inv is not None
    by_kind: dict[str, list[PublishedDevice]] = {}
    for dev in devices.values():
        name = dra.parse_device_name(dev.name)
        if name is None or dev.driver != dra.DRIVER:
            continue
        if name.type == dra.TYPE_RDMA_VF:
            found = vf_of(inv, name)
            if found is None or found[1].bus_id in state.vf_taken.get(RDMA, {}).get(name.minor, ()):
                continue
        elif inv.slot(name.device_type, name.minor) is None:
            continue
        by_kind.setdefault(name.type, []).append(dev)
    attrs: list[set[str]] = [set() for _ in creq.slots]
    for c in creq.constraints:
        for i in c.slots:
            attrs[i].add(c.attribute)
    out = []
    for i, slot in enumerate(creq.slots):
        out.append(
            frozenset(
                d.name
                for d in by_kind.get(slot.kind, ())
                if all(d.attribute(a) is not None for a in attrs[i])
                and (
                    not slot.capacity
                    or (d.shared and consumed(dict(slot.capacity), d.capacities) is not None)
                )
                and not blocking(d.taints, slot.tolerations)
                and all(p.matches(d) for p in slot.selectors)
            )
        )
    return out


def _tainted(creq: ClaimsRequest, kind: str, devices: Mapping[str, PublishedDevice]) -> str:
    """How many devices of `kind` a taint keeps from the requests, said after the count."""
    tolerations = [s.tolerations for s in creq.slots if s.kind == kind]
    kept = [
        d.name
        for d in devices.values()
        if (n := dra.parse_device_name(d.name)) is not None
        and n.type == kind
        and all(blocking(d.taints, t) for t in tolerations)
    ]
    if not kept:
        return ""
    example = blocking(devices[kept[0]].taints, tolerations[0])[0]
    return f"; {len(kept)} tainted ({kept[0]}: {example})"


def _whole_only(creq: ClaimsRequest, devices: Mapping[str, PublishedDevice]) -> Rejection | None:
    """A GPU share asked of a node that publishes no GPU as sharable: said as such."""
    if not any(s.capacity for s in creq.slots):
        return None
    if sharable_gpus(devices.values()):
        return None
    return Rejection(
        WHOLE_ONLY,
        "the node's GPUs are whole only: its ResourceSlices publish none with allowMultipleAllocations"
        " (consumable capacity is off before Kubernetes 1.36), so it serves no GPU share",
    )


def _missing_attribute(creq: ClaimsRequest, devices: Mapping[str, PublishedDevice]) -> Rejection | None:
    """A constraint's attribute that no published device of a request's kind carries: said as such
    (the node has no NVLink partition of that size, say) rather than as too few devices."""
    kinds: dict[str, list[PublishedDevice]] = {}
    for dev in devices.values():
        name = dra.parse_device_name(dev.name)
        if name is not None:
            kinds.setdefault(name.type, []).append(dev)
    for c in creq.constraints:
        for kind in sorted({creq.slots[i].kind for i in c.slots}):
            if any(d.attribute(c.attribute) is not None for d in kinds.get(kind, ())):
                continue
            partition = dra.partition_of(c.attribute)
            why = ""
            if partition is not None:
                link = "NVLink" if partition[1] else "PCIe"
                why = f": the node has no {link} partition of {partition[0]} GPUs"
            return Rejection(NO_CANDIDATES, f"no published {_NOUN[kind]} carry {c.attribute}{why}")
    return None


def _minors(names: frozenset[str] | set[str]) -> set[int]:
    return {n.minor for d in names if (n := dra.parse_device_name(d)) is not None}


def _bounds(inv: NodeInventory, gpus: set[int], nics: set[int]) -> Bounds:
    out: dict[str, dict[int, dict[str, int]]] = {}
    for dtype, minors in ((GPU, gpus), (RDMA, nics)):
        for m in sorted(minors):
            slot = inv.slot(dtype, m)
            if slot is not None and slot.total:
                out.setdefault(dtype, {})[m] = dict(slot.total)
    return out


def _attempts(
    creq: ClaimsRequest,
    cands: list[frozenset[str]],
    inv: NodeInventory,
    state: NodeState,
    devices: Mapping[str, PublishedDevice],
) -> Iterator[tuple[str, Bounds]]:
    kinds = [s.kind for s in creq.slots]
    gpu_names = set().union(*(c for c, k in zip(cands, kinds, strict=True) if k == dra.TYPE_GPU))
    nic_names = set().union(*(c for c, k in zip(cands, kinds, strict=True) if k != dra.TYPE_GPU))
    gpus, nics = _minors(gpu_names), _minors(nic_names)
    yield "", _bounds(inv, gpus, nics)
    if creq.regroup is not None:
        attr = creq.regroup.attribute
        groups: dict[object, set[int]] = {}
        for d in gpu_names:
            n = dra.parse_device_name(d)
            if n is not None:
                groups.setdefault(devices[d].attribute(attr), set()).add(n.minor)
        need = creq.count(dra.TYPE_GPU)
        free = GPUSummary.of(state).whole_mask
        fitting = [
            (sum(1 for m in ms if free >> m & 1), str(v), ms) for v, ms in groups.items() if v is not None
        ]
        for n_free, value, ms in sorted(fitting, key=lambda t: (t[0], t[1])):
            if n_free >= need:
                yield f"{attr} = {value}: only its {n_free} free GPUs", _bounds(inv, ms, nics)
    if creq.pairs:
        yield (
            "GPUs capped per locality to the free NICs there",
            _bounds(inv, _capped(creq, gpu_names, nic_names, state, devices), nics),
        )


def _capped(
    creq: ClaimsRequest,
    gpu_names: set[str],
    nic_names: set[str],
    state: NodeState,
    devices: Mapping[str, PublishedDevice],
) -> set[int]:
    """GPUs kept per value of the pairs' attribute: no more than the NICs (or VFs) free there."""
    attr = creq.pairs[0].attribute
    nic_free: dict[object, int] = {}
    for d in nic_names:
        n = dra.parse_device_name(d)
        if n is None or (n.type == dra.TYPE_RDMA and any(state.used.get(RDMA, {}).get(n.minor, {}).values())):
            continue
        value = devices[d].attribute(attr)
        nic_free[value] = nic_free.get(value, 0) + 1
    kept: set[int] = set()
    per: dict[object, int] = {}
    for d in sorted(gpu_names, key=lambda x: (len(x), x)):
        n = dra.parse_device_name(d)
        if n is None or not GPUSummary.of(state).whole_mask >> n.minor & 1:
            continue
        value = devices[d].attribute(attr)
        if per.get(value, 0) < nic_free.get(value, 0):
            per[value] = per.get(value, 0) + 1
            kept.add(n.minor)
    return kept


# -- the answer ----------------------------------------------------------------------------------------


def _answer(
    state: NodeState,
    inv: NodeInventory,
    creq: ClaimsRequest,
    cands: list[frozenset[str]],
    published: NodeDevices,
    got: Allocation,
    notes: list[str] | None,
) -> ClaimAnswer | None:
    entries: dict[str, DeviceAllocation] = {}
    chosen: dict[str, list[str]] = {dra.TYPE_GPU: [], dra.TYPE_RDMA: [], dra.TYPE_RDMA_VF: []}
    for entry in got.devices[GPU]:
        name = device_name(GPU, entry.minor)
        chosen[dra.TYPE_GPU].append(name)
        entries[name] = entry
    wants_vfs = creq.count(dra.TYPE_RDMA_VF) > 0
    vf_cands = frozenset().union(
        *(c for c, s in zip(cands, creq.slots, strict=True) if s.kind == dra.TYPE_RDMA_VF)
    )
    vfs: dict[str, tuple[int, VF]] = {}
    for entry in got.devices[RDMA]:
        if not wants_vfs:
            name = device_name(RDMA, entry.minor)
            chosen[dra.TYPE_RDMA].append(name)
            entries[name] = entry
            continue
        picked = _published_vf(state, inv, entry, vf_cands)
        if picked is not None:
            chosen[dra.TYPE_RDMA_VF].append(picked[0])
            vfs[picked[0]] = picked[1]
    handed = assign(creq, chosen, cands, published.devices)
    if handed is None:
        if notes is not None:
            notes.append(f"chosen {', '.join(n for ns in chosen.values() for n in ns)}: constraints unmet")
        return None
    results: dict[str, list[DeviceResult]] = {k: [] for k in creq.claims}
    usage: dict[str, dict[str, list[DeviceAllocation]]] = {k: {} for k in creq.claims}
    for slot, names in zip(creq.slots, handed, strict=True):
        for name in names:
            share = _share(state, inv, slot.capacity, published.devices[name], entries.get(name))
            if share is None:
                return None  # kube-scheduler's rounding takes more than the GPU has left
            results[slot.claim].append(
                DeviceResult(
                    slot.request,
                    dra.DRIVER,
                    published.pool,
                    name,
                    tolerations=slot.tolerations,
                    consumed=share[0],
                )
            )
            if share[1] is not None:
                entries[name] = share[1]
            if name in vfs:
                minor, vf = vfs[name]
                usage[slot.claim].setdefault(RDMA, []).append(vf_allocation(minor, vf))
            else:
                dtype = GPU if slot.kind == dra.TYPE_GPU else RDMA
                usage[slot.claim].setdefault(dtype, []).append(entries[name])
        if notes is not None:
            notes.append(f"claim {slot.claim}, request {slot.request}: {', '.join(names)}")
    return ClaimAnswer(
        state.name,
        published.pool,
        {k: tuple(v) for k, v in results.items()},
        {k: DeviceAllocations(v) for k, v in usage.items()},
        tuple(notes or ()),
    )


def _share(
    state: NodeState,
    inv: NodeInventory,
    asked: tuple[tuple[str, Quantity], ...],
    device: PublishedDevice,
    entry: DeviceAllocation | None,
) -> tuple[tuple[tuple[str, Quantity], ...], DeviceAllocation | None] | None:
    """For a GPU published with allowMultipleAllocations: what the result consumes (computed as
    kube-scheduler does, the defaults for a whole GPU) and the share the core counts for it (None:
    the whole GPU, as chosen); None when that no longer fits on the GPU. ((), None) for any other."""
    name = dra.parse_device_name(device.name)
    if not device.shared or entry is None or name is None or name.type != dra.TYPE_GPU:
        return (), None
    amounts = consumed(dict(asked), device.capacities)
    slot = inv.slot(GPU, name.minor)
    if amounts is None or slot is None:
        return None
    share = share_allocation(slot, amounts)
    if share is not None:
        free = state.free.get(GPU, {}).get(name.minor, slot.total)
        wants = {n: q.value() for n, q in (share.resources or {}).items() if n != rn.GPU_MEMORY_RATIO}
        if any(free.get(n, 0) < v for n, v in wants.items()):
            return None
    return tuple(sorted(amounts.items())), share


def _published_vf(
    state: NodeState, inv: NodeInventory, entry: DeviceAllocation, candidates: frozenset[str]
) -> tuple[str, tuple[int, VF]] | None:
    """The VF to hand out on a NIC the core chose: its own pick when published and matching, else
    the NIC's first free candidate VF."""
    slot = inv.slot(RDMA, entry.minor)
    if slot is None:
        return None
    taken = state.vf_taken.get(RDMA, {}).get(entry.minor, ())
    order = [vf.bus_id for vf in entry.vfs] + [vf.bus_id for vf in slot.vfs]
    for bus in order:
        index = vf_index(slot, bus)
        if index is None or bus in taken:
            continue
        name = device_name(RDMA, entry.minor, index)
        if name in candidates:
            return name, (entry.minor, slot.vfs[index])
    return None
