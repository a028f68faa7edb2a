"""Choose the exact devices for a pod on one node, or say why not (protocol sections 5-9).

`allocate` returns the `device-allocated` annotation (ids filled from the Device CR) or a
`Rejection`; `fits` answers only whether it would succeed, with the same rejection, and skips the
per-device work where node summaries already decide it. Both are pure and deterministic. Every
place where we differ from Koordinator on purpose is listed in docs/compatibility.md.

Everything particular to a device type is its handler's (`handler.DeviceHandler`, one per type in
`registry.HANDLERS`): this module only orders the types and joins their answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from allocator.core import reasons as rs
from allocator.core.devices.context import Bounds, Ctx, Pick, View, noun
from allocator.core.devices.handler import UNDECIDED
from allocator.core.devices.numa_policy import kubelet_alignment, misaligned
from allocator.core.devices.registry import HANDLERS
from allocator.core.node.features import FITS_EXACT, Feature
from allocator.core.node.inventory import NodeInventory
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.pod_request import TYPE_ORDER, PodRequest
from allocator.core.scoring.device import DeviceScoring
from apis.annotations import AllocatedVF, DeviceAllocation, DeviceAllocations


@dataclass(frozen=True)
class Allocation:
    """The devices chosen for a pod on one node."""

    devices: DeviceAllocations
    # The path the type with several took (GPUs: "partition", "topology", "plain", "preferred");
    # "" when none did.
    path: str = ""
    notes: tuple[str, ...] = ()

    def to_json(self) -> str:
        return self.devices.to_json()

    def minors(self, dtype: str) -> list[int]:
        return self.devices.minors(dtype)


# -- public entry points -------------------------------------------------------------------------


def allocate(
    state: NodeState,
    req: PodRequest,
    *,
    scoring: DeviceScoring | None = None,
    numa_mask: Iterable[int] | None = None,
    required: Bounds | None = None,
    explain: list[str] | None = None,
    prefer: Iterable[int] | None = None,
) -> Allocation | Rejection:
    """The devices for `req` on this node. `scoring=None` is Koordinator's Filter path (no device
    scorer: ties go to the lowest minor); the bind path passes the configured DeviceScoring.
    `numa_mask` restricts devices to those NUMA nodes; `required` bounds per type and minor what
    may be taken (only the minors it names are candidates). `prefer`: for a pod sharing a device,
    the minors the node's score assumed (the fragmentation term's pick); taken when they are
    candidates and fit, otherwise ignored. Lines explaining the choice are appended to `explain`
    when given.
    """
    preferred = tuple(sorted(set(prefer))) if prefer else ()
    aligned = kubelet_alignment(state, req)  # where kubelet's Topology Manager will put the devices
    if isinstance(aligned, Rejection):
        return _unaligned_verdict(state, req) or aligned
    if aligned is not None:
        numa_mask = aligned if numa_mask is None else aligned & frozenset(numa_mask)
    result = _solve(state, req, scoring, numa_mask, required, explain, want_plan=True, prefer=preferred)
    if isinstance(result, Rejection):
        if aligned is not None:
            return _unaligned_verdict(state, req) or misaligned(result, aligned, state)
        return result
    assert isinstance(result, tuple)
    plan, path = result
    inv = state.inventory
    devices = DeviceAllocations({}) if inv is None else _annotation(inv, plan)
    return Allocation(devices, path, tuple(explain or ()))


def fits(state: NodeState, req: PodRequest) -> Rejection | None:
    """None when `allocate(state, req)` would succeed, else its rejection."""
    aligned = kubelet_alignment(state, req)
    if aligned is None:
        return _unaligned_verdict(state, req)
    base = _unaligned_verdict(state, req)  # a pod that fits nowhere here says so, as elsewhere
    if base is not None or isinstance(aligned, Rejection):
        return base or aligned  # type: ignore[return-value]
    result = _solve(state, req, None, aligned, None, None, want_plan=False)
    return misaligned(result, aligned, state) if isinstance(result, Rejection) else None


def _unaligned_verdict(state: NodeState, req: PodRequest) -> Rejection | None:
    """`fits` where kubelet's Topology Manager restricts nothing."""
    devices = req.devices
    if len(devices) == 1:  # a pod of one type: its handler may decide from node summaries
        quick = HANDLERS[devices[0][0]].quick_verdict(state, req)
        if quick is not UNDECIDED:
            return quick  # type: ignore[return-value]
    result = _solve(state, req, None, None, None, None, want_plan=False)
    return result if isinstance(result, Rejection) else None


def fits_grouping(req: PodRequest) -> Feature | None:
    """The node summary that decides `fits(state, req)` alone: nodes equal in it get the same
    verdict, so a cluster-wide filter runs `fits` once per distinct value (None: the verdict does
    not depend on the node at all). A pod of one device type is grouped as its handler says
    (`DeviceHandler.grouping`), anything else by the node's full device usage."""
    if req.invalid is not None or not req.devices:
        return None
    feature = HANDLERS[req.devices[0][0]].grouping(req) if len(req.devices) == 1 else None
    return FITS_EXACT if feature is None else feature


# -- the algorithm ---------------------------------------------------------------------------------


def _solve(
    state: NodeState,
    req: PodRequest,
    scoring: DeviceScoring | None,
    numa_mask: Iterable[int] | None,
    required: Bounds | None,
    notes: list[str] | None,
    *,
    want_plan: bool,
    prefer: tuple[int, ...] = (),
) -> Rejection | tuple[dict[str, list[Pick]], str] | None:
    if req.invalid is not None:
        return req.invalid
    if not req.devices:
        return {}, ""
    inv = state.inventory
    if inv is None:
        return rs.Rejection(
            rs.NO_DEVICE_CR,
            "node has no Device resource, so its GPUs and NICs are unknown",
            unresolvable=True,
        )
    for dtype, _ in req.devices:
        refused = HANDLERS[dtype].admit(state, req)
        if refused is not None:
            return refused
    numa = None if numa_mask is None else frozenset(numa_mask)
    ctx = Ctx(state, inv, req, scoring, View(state, req, numa, required), notes, prefer=prefer)
    prepared = _prepare(ctx)
    if prepared is not None:
        return prepared

    plan: dict[str, list[Pick]] = {}
    path = ""
    several = len(ctx.per_type) > 1
    joint = [t for t in req.joint_types if t in ctx.per_type]
    if several and not want_plan:
        # The type allocated first: when it cannot be, nothing else needs looking at.
        first = joint[0] if joint else next(t for t in TYPE_ORDER if t in ctx.per_type)
        if HANDLERS[first].verdict_without_picks:
            early = _allocate_type(ctx, first, ctx.per_type[first][1], frozenset(), need_picks=False)
            if isinstance(early, Rejection):
                return early
    if several and joint:
        primary = joint[0]
        got = _allocate_type(ctx, primary, ctx.per_type[primary][1], frozenset(), need_picks=True)
        if isinstance(got, Rejection):
            return got
        picks, taken = got
        if not picks:
            return Rejection(rs.INSUFFICIENT_PRIMARY, f"no {noun(primary)} could be chosen")
        plan[primary] = picks
        path = taken or path
        pcies = HANDLERS[primary].joint_scopes(inv, picks)
        ctx.note(f"joint allocation: primary {primary} on PCIe {', '.join(sorted(pcies)) or '-'}")
        for dtype in joint[1:]:
            got = _allocate_type(ctx, dtype, ctx.per_type[dtype][1], pcies, need_picks=True)
            if isinstance(got, Rejection):
                return got
            plan[dtype], taken = got
            path = taken or path
            if req.joint_same_pcie and len(joint) > 1:
                theirs = HANDLERS[dtype].joint_scopes(inv, plan[dtype])
                if theirs != pcies:
                    return _joint_violation(primary, dtype, pcies, theirs)
    for dtype in TYPE_ORDER:
        if dtype not in ctx.per_type or dtype in plan:
            continue
        got = _allocate_type(ctx, dtype, ctx.per_type[dtype][1], frozenset(), need_picks=want_plan or several)
        if isinstance(got, Rejection):
            return got
        plan[dtype], taken = got
        path = taken or path
    return plan, path


def _prepare(ctx: Ctx) -> Rejection | None:
    """Request per device and desired count for every requested type (protocol 7.3)."""
    inv, req = ctx.inv, ctx.req
    for dtype, resources in req.devices:
        if not inv.has_type(dtype):
            return Rejection(
                rs.INSUFFICIENT_DEVICES.format(type=dtype), f"node has no {noun(dtype, 2)}", True
            )
        demand = HANDLERS[dtype].demand(ctx, resources)
        if isinstance(demand, Rejection):
            return demand
        ctx.per_type[dtype] = demand
    for dtype in ctx.per_type:
        hint = req.hint(dtype)
        if (
            hint is not None
            and hint.vf_selector is not None
            and not any(s.vf_groups for s in inv.slots(dtype))
        ):
            return Rejection(
                rs.INSUFFICIENT_VFS.format(type=dtype),
                f"node's {noun(dtype, 2)} have no virtual functions",
                True,
            )
    return None


def _allocate_type(
    ctx: Ctx, dtype: str, desired: int, pcies: frozenset[str], *, need_picks: bool
) -> Rejection | tuple[list[Pick], str]:
    per, _ = ctx.per_type[dtype]
    desired = max(desired, 1)
    return HANDLERS[dtype].choose(ctx, per, desired, pcies, need_picks=need_picks)


def _joint_violation(primary: str, dtype: str, want: frozenset[str], got: frozenset[str]) -> Rejection:
    missing = sorted(want - got)
    where = f"PCIe {', '.join(missing)}" if missing else f"PCIe {', '.join(sorted(got - want))} only"
    return Rejection(
        rs.JOINT_VIOLATION,
        f"need a free {noun(dtype)} on the PCIe switch of every chosen {noun(primary)}",
        detail=f"none on {where}",
    )


# -- output (4.2) -----------------------------------------------------------------------------------


def _annotation(inv: NodeInventory, plan: Mapping[str, list[Pick]]) -> DeviceAllocations:
    out: dict[str, list[DeviceAllocation]] = {}
    for dtype in TYPE_ORDER:
        picks = plan.get(dtype)
        if not picks:
            continue
        entries = []
        handler = HANDLERS[dtype]
        for p in picks:
            slot = inv.slot(dtype, p.minor)
            entry = DeviceAllocation(
                minor=p.minor,
                resources=handler.resources(dict(p.resources), slot),
                id=slot.id if slot is not None else "",
            )
            if p.vf is not None:
                entry.vfs = [AllocatedVF(p.vf.minor, p.vf.bus_id)]
            entries.append(entry)
        out[dtype] = entries
    return DeviceAllocations(out)
