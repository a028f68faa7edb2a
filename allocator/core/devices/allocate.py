"""Choose the exact devices for a pod on one node, or say why not (protocol sections 5-9).

`allocate` returns the `device-allocated` annotation (ids filled from the Device CR) or a
`Rejection`; `fits` answers only whether it would succeed, with the same rejection, and skips the
per-device work where node summaries already decide it. Both are pure and deterministic. Every
place where we differ from Koordinator on purpose is listed in docs/compatibility.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from allocator.core import reasons as rs
from allocator.core.devices.context import Bounds, Ctx, Pick, View, noun
from allocator.core.devices.gpu import feasible_partitions
from allocator.core.devices.messages import (
    gpu_shortage,
)
from allocator.core.devices.numa_policy import kubelet_alignment, misaligned
from allocator.core.devices.plain import pcie_scopes
from allocator.core.devices.registry import HANDLERS
from allocator.core.node.features import FITS_EXACT, FITS_SHARE, FITS_WHOLE, Feature
from allocator.core.node.inventory import NodeInventory
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.pod_request import TYPE_ORDER, GPURequirement, PodRequest
from allocator.core.scoring.device import DeviceScoring
from apis import keys
from apis import resources as rn
from apis.annotations import AllocatedVF, DeviceAllocation, DeviceAllocations
from apis.quantity import Format, Quantity

GPU, RDMA, FPGA = rn.DeviceType.GPU, rn.DeviceType.RDMA, rn.DeviceType.FPGA


@dataclass(frozen=True)
class Allocation:
    """The devices chosen for a pod on one node."""

    devices: DeviceAllocations
    gpu_path: str = ""  # "partition", "topology", "plain" or "" (no GPU)
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
    prefer_gpus: Iterable[int] | None = None,
) -> Allocation | Rejection:
    """The devices for `req` on this node. `scoring=None` is Koordinator's Filter path (no device
    scorer: ties go to the lowest minor); the bind path passes the configured DeviceScoring.
    `numa_mask` restricts devices to those NUMA nodes; `required` bounds per type and minor what
    may be taken (only the minors it names are candidates). `prefer_gpus`: for a shared-GPU pod,
    the GPUs the node's score assumed (the fragmentation term's pick); taken when they are
    candidates and fit, otherwise ignored. Lines explaining the choice are appended to `explain`
    when given.
    """
    prefer = tuple(sorted(set(prefer_gpus))) if prefer_gpus else ()
    aligned = kubelet_alignment(state, req)  # where kubelet's Topology Manager will put the devices
    if isinstance(aligned, Rejection):
        return _unaligned_verdict(state, req) or aligned
    if aligned is not None:
        numa_mask = aligned if numa_mask is None else aligned & frozenset(numa_mask)
    result = _solve(state, req, scoring, numa_mask, required, explain, want_plan=True, prefer=prefer)
    if isinstance(result, Rejection):
        if aligned is not None:
            return _unaligned_verdict(state, req) or misaligned(result, aligned, state)
        return result
    assert isinstance(result, tuple)
    plan, gpu_path = result
    inv = state.inventory
    devices = DeviceAllocations({}) if inv is None else _annotation(inv, plan)
    return Allocation(devices, gpu_path, tuple(explain or ()))


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
    g = req.plain_gpu
    if g is not None:
        quick = _quick_gpu_verdict(state, req, g)
        if quick is not _UNDECIDED:
            return quick  # type: ignore[return-value]
    result = _solve(state, req, None, None, None, None, want_plan=False)
    return result if isinstance(result, Rejection) else None


def fits_grouping(req: PodRequest) -> Feature | None:
    """The node summary that decides `fits(state, req)` alone: nodes equal in it get the same
    verdict, so a cluster-wide filter runs `fits` once per distinct value (None: the verdict does
    not depend on the node at all). Keep in step with `fits`: the whole-GPU and equal-share
    features name exactly what `_quick_gpu_verdict` and, for whole GPUs on a node that honours
    partitions, `allocate_gpu` read; anything else is grouped by the node's full device usage."""
    if req.invalid is not None or not req.devices:
        return None
    g = req.plain_gpu
    if g is not None:
        if g.shared and g.count == 1 and g.equal_share is not None:
            return FITS_SHARE
        if g.whole:
            return FITS_WHOLE
    return FITS_EXACT


# -- the common case from summaries ----------------------------------------------------------------

_UNDECIDED = object()


def _quick_gpu_verdict(state: NodeState, req: PodRequest, g: GPURequirement) -> object:
    """GPU-only requests without hints: decided from the node's GPU bitmasks alone.

    Mirrors `allocate_gpu`'s verdict exactly (the property tests hold the two together).
    """
    inv = state.inventory
    if inv is None or not inv.gpu_mask:
        return _UNDECIDED
    if g.shared:
        if req.isolation_provider and (refused := _isolation_refusal(state, req)) is not None:
            return refused
        if g.count == 1 and g.equal_share is not None:
            # One GPU with x% of compute and of memory: the node's best GPU decides.
            return None if state.gpu_max_share >= g.equal_share else gpu_shortage(g, 0, selector=False)
    elif g.honor_partition or inv.partition_honor:
        return _UNDECIDED
    feasible = state.gpu_whole_mask if g.whole else state.gpu_fit_mask(g.per_gpu)
    available = feasible.bit_count()
    if available >= g.count:
        return None
    if not g.shared and inv.partitions is not None:
        groups = inv.partitions.get(g.count)
        if groups and feasible_partitions(groups, g, state.gpu_used_mask, inv.gpu_healthy_mask):
            return None
    return gpu_shortage(g, available, selector=False)


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
    if req.gpu is not None and req.gpu.shared and (refused := _isolation_refusal(state, req)) is not None:
        return refused
    numa = None if numa_mask is None else frozenset(numa_mask)
    ctx = Ctx(state, inv, req, scoring, View(state, req, numa, required), notes, prefer_gpus=prefer)
    prepared = _prepare(ctx)
    if prepared is not None:
        return prepared

    plan: dict[str, list[Pick]] = {}
    gpu_path = ""
    only_gpu = list(ctx.per_type) == [GPU]
    joint = [t for t in req.joint_types if t in ctx.per_type]
    gpu_first = GPU in ctx.per_type and (len(ctx.per_type) == 1 or not joint or joint[0] == GPU)
    if gpu_first and not only_gpu and not want_plan:
        # GPUs are allocated first: when they cannot be, nothing else needs looking at.
        early = _allocate_type(ctx, GPU, ctx.per_type[GPU][1], frozenset(), need_picks=False)
        if isinstance(early, Rejection):
            return early
    if len(ctx.per_type) > 1 and joint:
        primary = joint[0]
        got = _allocate_type(ctx, primary, ctx.per_type[primary][1], frozenset(), need_picks=True)
        if isinstance(got, Rejection):
            return got
        picks, path = got
        if not picks:
            return Rejection(rs.INSUFFICIENT_PRIMARY, f"no {noun(primary)} could be chosen")
        plan[primary] = picks
        gpu_path = path or gpu_path
        pcies = pcie_scopes(inv, primary, picks)
        ctx.note(f"joint allocation: primary {primary} on PCIe {', '.join(sorted(pcies)) or '-'}")
        for dtype in joint[1:]:
            desired = ctx.per_type[dtype][1]
            # A GPU count is the pod's request, never stretched to cover the primary's switches
            # (Koordinator would hand out extra cards); SamePCIe is then checked as for any type.
            if req.joint_same_pcie and desired < len(pcies) and dtype != GPU:
                desired = len(pcies)
            got = _allocate_type(ctx, dtype, desired, pcies, need_picks=True)
            if isinstance(got, Rejection):
                return got
            plan[dtype], path = got
            gpu_path = path or gpu_path
            if req.joint_same_pcie and len(joint) > 1:
                theirs = pcie_scopes(inv, dtype, plan[dtype])
                if theirs != pcies:
                    return _joint_violation(primary, dtype, pcies, theirs)
    for dtype in TYPE_ORDER:
        if dtype not in ctx.per_type or dtype in plan:
            continue
        got = _allocate_type(
            ctx, dtype, ctx.per_type[dtype][1], frozenset(), need_picks=want_plan or not only_gpu
        )
        if isinstance(got, Rejection):
            return got
        plan[dtype], path = got
        gpu_path = path or gpu_path
    return plan, gpu_path


def _isolation_refusal(state: NodeState, req: PodRequest) -> Rejection | None:
    """A shared-GPU pod that names an isolation provider needs a node offering the same (7.2)."""
    wanted = req.isolation_provider
    offered = state.labels.get(keys.GPU_ISOLATION_PROVIDER, "")
    if not wanted or wanted == offered:
        return None
    return Rejection(
        rs.ISOLATION_PROVIDER,
        f"pod needs GPU isolation provider {wanted}",
        unresolvable=True,
        detail=f"the node offers {offered or 'none'}",
    )


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
        for p in picks:
            slot = inv.slot(dtype, p.minor)
            res = dict(p.resources)
            if slot is not None:
                res = HANDLERS[dtype].resources(res, slot)
            entry = DeviceAllocation(
                minor=p.minor,
                resources={
                    n: Quantity.of(v, Format.BINARY_SI if n == rn.GPU_MEMORY else Format.DECIMAL_SI)
                    for n, v in res.items()
                },
                id=slot.id if slot is not None else "",
            )
            if p.vf is not None:
                entry.vfs = [AllocatedVF(p.vf.minor, p.vf.bus_id)]
            entries.append(entry)
        out[dtype] = entries
    return DeviceAllocations(out)
