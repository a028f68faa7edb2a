"""Choose the exact devices for a pod on one node, or say why not (protocol sections 5-9).

`allocate` returns the `device-allocated` annotation (ids filled from the Device CR) or a
`Rejection`; `fits` answers only whether it would succeed, with the same rejection, and skips the
per-device work where node summaries already decide it. Both are pure and deterministic. Every
place where we differ from Koordinator on purpose is listed in docs/compatibility.md.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from allocator.core import reasons as rs
from allocator.core.inventory import LEVEL_DEVICE, VF, DeviceSlot, NodeInventory, Scope
from allocator.core.messages import (
    gpu_shortage,
    partition_shortage,
    scope_label,
    scope_shortage,
    type_shortage,
)
from allocator.core.reasons import Rejection
from allocator.core.request import TYPE_ORDER, GPURequirement, PodRequest, Resources
from allocator.core.scoring.device import DeviceScoring
from allocator.core.state import NodeState, all_zero
from allocator.core.state import fits as res_fits
from apis import keys
from apis import resources as rn
from apis.annotations import AllocatedVF, DeviceAllocation, DeviceAllocations
from apis.quantity import Format, Quantity
from apis.selector import LabelSelector

GPU, RDMA, FPGA = rn.DeviceType.GPU, rn.DeviceType.RDMA, rn.DeviceType.FPGA
_TYPE_RESOURCE = {RDMA: rn.RDMA, FPGA: rn.FPGA}
_BINPACK_WEIGHTS = ((8, 10000), (4, 100), (2, 1))

Bounds = Mapping[str, Mapping[int, Mapping[str, int]]]


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


@dataclass(frozen=True, slots=True)
class _Pick:
    minor: int
    resources: Resources
    vf: VF | None = None


@dataclass
class _Ctx:
    state: NodeState
    inv: NodeInventory
    req: PodRequest
    scoring: DeviceScoring | None
    view: _View
    notes: list[str] | None
    per_type: dict[str, tuple[Resources, int]] = field(default_factory=dict)  # request per device, count

    def note(self, text: str) -> None:
        if self.notes is not None:
            self.notes.append(text)


class _View:
    """Candidate devices per type with their free resources (protocol 8.1).

    Without a NUMA mask, bounds or selectors this is the node state itself, copied nothing.
    """

    def __init__(self, state: NodeState, req: PodRequest, numa: frozenset[int] | None, bounds: Bounds | None):
        self.state = state
        inv = state.inventory
        assert inv is not None
        self.filtered = numa is not None or bounds is not None or req.has_selectors
        self.free: dict[str, dict[int, dict[str, int]]] = {}
        self.cut_mask = 0  # GPUs whose free a bound cut below what is really free
        self.excluded_used = 0
        for dtype, _ in req.devices:
            if not self.filtered:
                self.free[dtype] = state.free.get(dtype, {})
                continue
            hint = req.hint(dtype)
            selector = hint.selector if hint is not None else None
            frees: dict[int, dict[str, int]] = {}
            bound = None if bounds is None else bounds.get(dtype, {})
            for slot in inv.slots(dtype):
                if numa is not None and (not slot.has_topology or (slot.numa >= 0 and slot.numa not in numa)):
                    continue
                if selector is not None and not selector.matches(slot.labels):
                    continue
                free = state.free.get(dtype, {}).get(slot.minor, {})
                if bound is not None:
                    if slot.minor not in bound:
                        continue
                    cut = {n: min(v, bound[slot.minor][n]) for n, v in free.items() if n in bound[slot.minor]}
                    if cut != free and dtype == GPU:
                        self.cut_mask |= 1 << slot.minor
                    free = cut
                frees.setdefault(slot.minor, free)
            if frees and not all(all_zero(f) for f in frees.values()):
                self.free[dtype] = frees
        self.pcie_exclusive: set[str] = set()
        for dtype, _ in req.devices:
            hint = req.hint(dtype)
            if hint is not None and hint.pcie_exclusive and dtype in self.free:
                self._keep_idle_pcie(dtype)

    def _keep_idle_pcie(self, dtype: str) -> None:
        """exclusivePolicy PCIeLevel: only PCIe scopes none of whose devices of this type is in use."""
        inv = self.state.inventory
        assert inv is not None
        used = self.state.used.get(dtype, {})
        busy = {s.pcie_scope for s in inv.slots(dtype) if any(used.get(s.minor, {}).values())}
        keep = {}
        for minor, free in self.free[dtype].items():
            slot = inv.slot(dtype, minor)
            if slot is not None and slot.has_topology and slot.pcie_scope not in busy:
                keep[minor] = free
        self.free[dtype] = keep
        self.filtered = True

    def gpu_masks(self, g: GPURequirement) -> tuple[int, int, int]:
        """(feasible, in view and healthy, in use) GPU bitmasks."""
        state = self.state
        inv = state.inventory
        assert inv is not None
        used = state.gpu_used_mask | self.cut_mask
        if not self.filtered:
            return state.gpu_fit_mask(g.per_gpu), inv.gpu_healthy_mask, used
        feasible = total = 0
        for minor, free in self.free.get(GPU, {}).items():
            if not (inv.gpu_healthy_mask >> minor & 1):
                continue
            total |= 1 << minor
            if free and not all_zero(free) and res_fits(g.per_gpu, free):
                feasible |= 1 << minor
        return feasible, total, used


# -- public entry points -------------------------------------------------------------------------


def allocate(
    state: NodeState,
    req: PodRequest,
    *,
    scoring: DeviceScoring | None = None,
    numa_mask: Iterable[int] | None = None,
    required: Bounds | None = None,
    explain: list[str] | None = None,
) -> Allocation | Rejection:
    """The devices for `req` on this node. `scoring=None` is Koordinator's Filter path (no device
    scorer: ties go to the lowest minor); the bind path passes the configured DeviceScoring.
    `numa_mask` restricts devices to those NUMA nodes; `required` bounds per type and minor what
    may be taken (only the minors it names are candidates). Lines explaining the choice are
    appended to `explain` when given.
    """
    result = _solve(state, req, scoring, numa_mask, required, explain, want_plan=True)
    if isinstance(result, Rejection):
        return result
    assert isinstance(result, tuple)
    plan, gpu_path = result
    inv = state.inventory
    devices = DeviceAllocations({}) if inv is None else _annotation(inv, plan)
    return Allocation(devices, gpu_path, tuple(explain or ()))


def fits(state: NodeState, req: PodRequest) -> Rejection | None:
    """None when `allocate(state, req)` would succeed, else its rejection."""
    g = req.plain_gpu
    if g is not None:
        quick = _quick_gpu_verdict(state, req, g)
        if quick is not _UNDECIDED:
            return quick  # type: ignore[return-value]
    result = _solve(state, req, None, None, None, None, want_plan=False)
    return result if isinstance(result, Rejection) else None


# -- the common case from summaries ----------------------------------------------------------------

_UNDECIDED = object()


def _quick_gpu_verdict(state: NodeState, req: PodRequest, g: GPURequirement) -> object:
    """GPU-only requests without hints: decided from the node's GPU bitmasks alone.

    Mirrors `_allocate_gpu`'s verdict exactly (the property tests hold the two together).
    """
    inv = state.inventory
    if inv is None or not inv.gpu_mask:
        return _UNDECIDED
    if g.shared:
        if req.isolation_provider and (refused := _isolation_refusal(state, req)) is not None:
            return refused
    elif g.honor_partition or inv.partition_honor:
        return _UNDECIDED
    feasible = state.gpu_whole_mask if g.whole else state.gpu_fit_mask(g.per_gpu)
    available = feasible.bit_count()
    if available >= g.count:
        return None
    if not g.shared and inv.partitions is not None:
        groups = inv.partitions.get(g.count)
        if groups and _feasible_partitions(groups, g, state.gpu_used_mask, inv.gpu_healthy_mask):
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
) -> Rejection | tuple[dict[str, list[_Pick]], str] | None:
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
    ctx = _Ctx(state, inv, req, scoring, _View(state, req, numa, required), notes)
    prepared = _prepare(ctx)
    if prepared is not None:
        return prepared

    plan: dict[str, list[_Pick]] = {}
    gpu_path = ""
    only_gpu = list(ctx.per_type) == [GPU]
    joint = [t for t in req.joint_types if t in ctx.per_type]
    if len(ctx.per_type) > 1 and joint:
        primary = joint[0]
        got = _allocate_type(ctx, primary, ctx.per_type[primary][1], frozenset(), need_picks=True)
        if isinstance(got, Rejection):
            return got
        picks, path = got
        if not picks:
            return Rejection(rs.INSUFFICIENT_PRIMARY, f"no {_noun(primary)} could be chosen")
        plan[primary] = picks
        gpu_path = path or gpu_path
        pcies = _pcie_scopes(inv, primary, picks)
        ctx.note(f"joint allocation: primary {primary} on PCIe {', '.join(sorted(pcies)) or '-'}")
        for dtype in joint[1:]:
            desired = ctx.per_type[dtype][1]
            if req.joint_same_pcie and desired < len(pcies):
                desired = len(pcies)
            got = _allocate_type(ctx, dtype, desired, pcies, need_picks=True)
            if isinstance(got, Rejection):
                return got
            plan[dtype], path = got
            gpu_path = path or gpu_path
            if req.joint_same_pcie and len(joint) > 1:
                theirs = _pcie_scopes(inv, dtype, plan[dtype])
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
        f"pod needs GPU isolation provider {wanted}; the node offers {offered or 'none'}",
        unresolvable=True,
    )


def _prepare(ctx: _Ctx) -> Rejection | None:
    """Request per device and desired count for every requested type (protocol 7.3)."""
    inv, req = ctx.inv, ctx.req
    for dtype, resources in req.devices:
        if not inv.has_type(dtype):
            return Rejection(
                rs.INSUFFICIENT_DEVICES.format(type=dtype), f"node has no {_noun(dtype, 2)}", True
            )
        if dtype == GPU:
            g = req.gpu
            assert g is not None
            if g.scope_level == LEVEL_DEVICE and g.count > 1:
                return Rejection(
                    rs.UNSATISFIABLE_DEVICE_SCOPE,
                    f"requiredTopologyScope Device holds one GPU; the pod asks for {g.count}",
                    True,
                )
            ctx.per_type[GPU] = (g.per_gpu, g.count)
            continue
        name = _TYPE_RESOURCE[dtype]
        q = dict(resources).get(name, 0)
        hint = req.hint(dtype)
        count, per = 1, resources
        if q > 100 and q % 100 == 0:
            count, per = q // 100, ((name, 100),)
        elif hint is not None and hint.allocate_strategy == "ApplyForAll":
            slots = inv.slots(dtype)
            if hint.selector is not None:
                slots = tuple(s for s in slots if hint.selector.matches(s.labels))
            count = len(slots)
            if count == 0:
                return Rejection(
                    rs.INSUFFICIENT_DEVICES.format(type=dtype),
                    f"no {_noun(dtype)} on the node matches the selector",
                    True,
                )
        elif hint is not None and hint.allocate_strategy == "RequestsAsCount":
            count = q
            per = ((name, 100 if hint.exclusive_policy == "DeviceLevel" else 1),)
        ctx.per_type[dtype] = (per, count)
    for dtype in ctx.per_type:
        hint = req.hint(dtype)
        if (
            hint is not None
            and hint.vf_selector is not None
            and not any(s.vf_groups for s in inv.slots(dtype))
        ):
            return Rejection(
                rs.INSUFFICIENT_VFS.format(type=dtype),
                f"node's {_noun(dtype, 2)} have no virtual functions",
                True,
            )
    return None


def _allocate_type(
    ctx: _Ctx, dtype: str, desired: int, pcies: frozenset[str], *, need_picks: bool
) -> Rejection | tuple[list[_Pick], str]:
    per, _ = ctx.per_type[dtype]
    max_count = max(desired, len(pcies))
    desired = max(desired, 1)
    max_count = max(max_count, desired)
    if dtype == GPU:
        return _allocate_gpu(ctx, desired, max_count, need_picks=need_picks)
    picks = _select_plain(ctx, dtype, per, desired, max_count, pcies)
    if isinstance(picks, Rejection):
        return picks
    return picks, ""


# -- GPUs (protocol 8.3 and 9) ---------------------------------------------------------------------


def _allocate_gpu(
    ctx: _Ctx, desired: int, max_count: int, *, need_picks: bool
) -> Rejection | tuple[list[_Pick], str]:
    g = ctx.req.gpu
    assert g is not None
    inv, view = ctx.inv, ctx.view
    feasible, healthy, used = view.gpu_masks(g)
    gpu_hint = ctx.req.hint(GPU)
    has_selector = gpu_hint is not None and gpu_hint.selector is not None

    # Partitions: mandatory when the pod or the node honours them, else only a first try.
    if not g.shared:
        honor = g.honor_partition or inv.partition_honor
        result = _by_partition(ctx, g, used, healthy, honor)
        if isinstance(result, Rejection):
            return result
        if result is not None:
            return [_Pick(m, g.per_gpu) for m in result], "partition"

    level = 0 if g.scope_level == LEVEL_DEVICE else g.scope_level
    if inv.tree is None or (g.shared and g.count > 1):
        if level:
            if inv.tree is None:
                return Rejection(
                    rs.MISSING_TOPOLOGY_TREE,
                    f"requiredTopologyScope {g.required_scope} needs the GPUs' topology; "
                    "the node's Device has none",
                    True,
                )
            return Rejection(
                rs.UNSUPPORTED_MULTI_SHARED,
                f"a GPU share spread over {g.count} GPUs cannot have a required topology scope",
                True,
            )
    else:
        if not need_picks and not g.shared:
            best, scope = _largest_in_scopes(inv, feasible, level)
            if best >= g.count:
                return [], "topology"
            if level:
                return scope_shortage(g, best, scope)
            return gpu_shortage(g, feasible.bit_count(), selector=has_selector)
        picked = _walk_with_nvlink(ctx, g, feasible, used, level)
        if picked is not None:
            scope, minors = picked
            ctx.note(f"GPUs {_list(minors)} from the scope tree ({scope_label(scope)})")
            return [_Pick(m, g.per_gpu) for m in minors], "topology"
        if level:
            best, scope = _largest_in_scopes(inv, feasible, level)
            return scope_shortage(g, best, scope)
        # Koordinator stops with "Insufficient GPU Devices" here; the plain path below is what a
        # failed walk without a required scope can still satisfy (see docs/compatibility.md).

    if not need_picks:
        if feasible.bit_count() >= desired:
            return [], "plain"
        return gpu_shortage(g, feasible.bit_count(), selector=has_selector)
    picks = _select_plain(ctx, GPU, g.per_gpu, desired, max_count, frozenset())
    if isinstance(picks, Rejection):
        return gpu_shortage(g, feasible.bit_count(), selector=has_selector)
    return picks, "plain"


def _feasible_partitions(groups: tuple, g: GPURequirement, used: int, healthy: int) -> list:
    feasible = []
    for group in groups:
        for part, mask in group.partitions:
            if mask & used or mask & ~healthy:
                continue
            if g.ring_bus_bandwidth is not None and (
                part.ring_bus_bandwidth is None or g.ring_bus_bandwidth > part.ring_bus_bandwidth.nanos
            ):
                continue
            feasible.append((part, mask))
        if feasible or g.restricted_partition:
            break
    return feasible


def _by_partition(
    ctx: _Ctx, g: GPURequirement, used: int, healthy: int, honor: bool
) -> Rejection | tuple[int, ...] | None:
    """The partition to take, a rejection when partitions are mandatory and none fits, or None."""
    index = ctx.inv.partitions
    if index is None:
        if honor:
            return Rejection(
                rs.MISSING_PARTITION_TABLE,
                "GPU partitions are required but the node has no partition table",
                True,
            )
        return None
    groups = index.get(g.count)
    if not groups:
        if honor:
            sizes = ", ".join(str(n) for n in sorted(index))
            return Rejection(
                rs.UNSUPPORTED_GPU_COUNT,
                f"no GPU partition holds {g.count} GPUs (partition sizes: {sizes})",
                True,
            )
        return None
    feasible = _feasible_partitions(groups, g, used, healthy)
    if not feasible:
        return partition_shortage(g) if honor else None
    if len(feasible) == 1:
        chosen = feasible[0][0]
    else:
        scored = [
            (_binpack_score(index, used | mask, g.count), i, part) for i, (part, mask) in enumerate(feasible)
        ]
        for score, _, part in scored:
            ctx.note(f"partition {_list(part.minors)}: bin-pack score {score}")
        chosen = max(scored, key=lambda t: (t[0], -t[1]))[2]
    ctx.note(f"GPUs {_list(chosen.minors)} from the partition table")
    return tuple(chosen.minors)


def _binpack_score(index: Mapping, taken: int, count: int) -> int:
    """How many larger partitions stay whole after taking `taken` (9.3 step 6)."""
    score = 0
    for size, weight in _BINPACK_WEIGHTS:
        if size < count:
            continue
        groups = index.get(size)
        if not groups:
            continue
        for part, mask in groups[0].partitions:
            if not mask & taken:
                score += weight * part.allocation_score
    return score


def _largest_in_scopes(inv: NodeInventory, feasible: int, level: int) -> tuple[int, Scope | None]:
    """The most feasible GPUs inside one scope of at least `level` (the root for level 0)."""
    best, where = -1, None
    for scope_level in sorted(inv.scopes_by_level):
        if scope_level < max(level, 1):
            continue
        for scope in inv.scopes_by_level[scope_level]:
            n = (feasible & scope.mask).bit_count()
            if n > best:
                best, where = n, scope
    return max(best, 0), where


def _walk_with_nvlink(
    ctx: _Ctx, g: GPURequirement, feasible: int, used: int, level: int
) -> tuple[Scope, tuple[int, ...]] | None:
    """The scope walk, first inside single NVLink domains when a multi-GPU request fits in one."""
    inv = ctx.inv
    tree = inv.tree
    assert tree is not None
    domains = inv.nvlink_domains
    if g.count > 1 and not g.shared and domains and not _one_domain_covers(domains, inv.gpu_mask):
        best = None
        for name, mask in domains.items():
            if (feasible & mask).bit_count() < g.count:
                continue
            found = _walk(tree, g, feasible & mask, used, level, ctx)
            if found is not None and (best is None or found[:2] > best[:2]):
                best = found
                ctx.note(f"NVLink domain {name} can hold all {g.count} GPUs")
        if best is not None:
            return best[3], best[4]
    found = _walk(tree, g, feasible, used, level, ctx)
    return None if found is None else (found[3], found[4])


def _one_domain_covers(domains: Mapping[str, int], gpus: int) -> bool:
    return len(domains) == 1 and next(iter(domains.values())) == gpus


def _walk(
    scope: Scope, g: GPURequirement, feasible: int, used: int, level: int, ctx: _Ctx, not_empty: int = 0
) -> tuple[int, int, int, Scope, tuple[int, ...]] | None:
    """Depth-first over the scope tree (8.3 "Walk"): the deepest scope that can hold the request
    wins, then the path with more scopes already in use (topology bin-packing), then the earlier."""
    count = g.count
    if len(scope.minors) < count:
        return None
    if scope.mask & used:
        not_empty += 1
    best = None
    for child in scope.children:
        if len(child.minors) < count:
            continue
        found = _walk(child, g, feasible, used, level, ctx, not_empty)
        if found is None:
            continue
        # Deeper first, then more scopes already in use; shared pods then by device score.
        rank = found[:3] if g.shared else found[:2]
        if best is None or rank > (best[:3] if g.shared else best[:2]):
            best = found
    if best is not None:
        return best
    if level > scope.level:
        return None
    if not g.shared:
        picked = [m for m in scope.minors if feasible >> m & 1][:count]
        if len(picked) < count:
            return None
        return scope.level, not_empty, -1, scope, tuple(picked)
    best_minor, best_score = -1, -1
    for m in scope.minors:
        if not feasible >> m & 1:
            continue
        score = _device_score(ctx, GPU, g.per_gpu, m)
        if score > best_score:
            best_minor, best_score = m, score
    if best_minor < 0:
        return None
    return scope.level, not_empty, best_score, scope, (best_minor,)


def _device_score(ctx: _Ctx, dtype: str, per: Resources, minor: int) -> int:
    if ctx.scoring is None:
        return 0
    slot = ctx.inv.slot(dtype, minor)
    total = slot.total if slot is not None else {}
    free = ctx.view.free.get(dtype, {}).get(minor, {})
    return ctx.scoring.score_device(dict(per), total, free)


# -- per-device selection (8.4) ------------------------------------------------------------------


def _select_plain(
    ctx: _Ctx, dtype: str, per: Resources, desired: int, max_count: int, pcies: frozenset[str]
) -> list[_Pick] | Rejection:
    inv = ctx.inv
    frees = ctx.view.free.get(dtype, {})
    hint = ctx.req.hint(dtype)
    vf_selector = hint.vf_selector if hint is not None else None
    if ctx.scoring is None:
        ranked = [(0, m) for m in sorted(frees)]
    else:
        ranked = sorted(((_device_score(ctx, dtype, per, m), m) for m in frees), key=lambda t: (-t[0], t[1]))
    if pcies and dtype != GPU:
        ranked = _round_robin(inv, dtype, ranked, pcies)
    picks: list[_Pick] = []
    taken_vfs = ctx.state.vf_taken.get(dtype, {})
    for score, minor in ranked:
        free = frees[minor]
        if all_zero(free) or not res_fits(per, free):
            continue
        vf = None
        if vf_selector is not None:
            slot = inv.slot(dtype, minor)
            vf = None if slot is None else _lowest_free_vf(slot, vf_selector, taken_vfs.get(minor, ()))
            if vf is None:
                continue
        picks.append(_Pick(minor, per, vf))
        if ctx.notes is not None:
            ctx.note(f"{dtype} {minor}: device score {score}" + (f", VF {vf.bus_id}" if vf else ""))
        if len(picks) == max_count:
            break
    if len(picks) < desired:
        if dtype == GPU:
            return Rejection(rs.INSUFFICIENT_DEVICES.format(type=dtype), "")
        return type_shortage(dtype, desired, len(picks), vf=vf_selector is not None, hint=hint)
    return picks


def _round_robin(
    inv: NodeInventory, dtype: str, ranked: list[tuple[int, int]], pcies: frozenset[str]
) -> list[tuple[int, int]]:
    """Preferred PCIe scopes first, one device of each per round (each round by score, then minor)."""
    groups: dict[str, list[tuple[int, int]]] = {}
    rest = []
    for item in ranked:
        slot = inv.slot(dtype, item[1])
        if slot is not None and slot.has_topology and slot.pcie_scope in pcies:
            groups.setdefault(slot.pcie_scope, []).append(item)
        else:
            rest.append(item)
    ordered = []
    depth = max((len(v) for v in groups.values()), default=0)
    for i in range(depth):
        ordered.extend(sorted((v[i] for v in groups.values() if i < len(v)), key=lambda t: (-t[0], t[1])))
    return ordered + rest


def _lowest_free_vf(slot: DeviceSlot, selector: LabelSelector, taken: Collection[str]) -> VF | None:
    """The free VF with the lowest busID among the groups the selector matches."""
    groups = slot.vf_groups
    matches: dict[int, bool] = {}
    for vf in slot.vfs_by_bus:
        if vf.bus_id in taken:
            continue
        ok = matches.get(vf.group)
        if ok is None:
            ok = matches[vf.group] = selector.matches(groups[vf.group][0])
        if ok:
            return vf
    return None


def _pcie_scopes(inv: NodeInventory, dtype: str, picks: list[_Pick]) -> frozenset[str]:
    out = set()
    for p in picks:
        slot = inv.slot(dtype, p.minor)
        if slot is not None and slot.has_topology:
            out.add(slot.pcie_scope)
    return frozenset(out)


def _joint_violation(primary: str, dtype: str, want: frozenset[str], got: frozenset[str]) -> Rejection:
    missing = sorted(want - got)
    where = f"PCIe {', '.join(missing)}" if missing else f"PCIe {', '.join(sorted(got - want))} only"
    return Rejection(
        rs.JOINT_VIOLATION,
        f"need a free {_noun(dtype)} on the PCIe switch of every chosen {_noun(primary)}; none on {where}",
    )


# -- output (4.2) -----------------------------------------------------------------------------------


def _annotation(inv: NodeInventory, plan: Mapping[str, list[_Pick]]) -> DeviceAllocations:
    out: dict[str, list[DeviceAllocation]] = {}
    for dtype in TYPE_ORDER:
        picks = plan.get(dtype)
        if not picks:
            continue
        entries = []
        for p in picks:
            slot = inv.slot(dtype, p.minor)
            res = dict(p.resources)
            if dtype == GPU and slot is not None:
                res = _with_gpu_memory(res, slot.total.get(rn.GPU_MEMORY, 0))
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


def _with_gpu_memory(res: dict[str, int], total_memory: int) -> dict[str, int]:
    """fillGPUTotalMem: derive the missing one of gpu-memory and gpu-memory-ratio from the GPU's size."""
    has_mem, has_ratio = rn.GPU_MEMORY in res, rn.GPU_MEMORY_RATIO in res
    if has_mem and has_ratio:
        return res
    if has_mem:
        ratio = int(res[rn.GPU_MEMORY] / total_memory * 100) if total_memory else 0
        return {**res, rn.GPU_MEMORY_RATIO: ratio}
    return {**res, rn.GPU_MEMORY: res.get(rn.GPU_MEMORY_RATIO, 0) * total_memory // 100}


# -- small helpers -----------------------------------------------------------------------------------

_NOUNS = {GPU: ("GPU", "GPUs"), RDMA: ("RDMA NIC", "RDMA NICs"), FPGA: ("FPGA", "FPGAs")}


def _noun(dtype: str, count: int = 1) -> str:
    one, many = _NOUNS.get(dtype, (dtype, dtype + "s"))
    return one if count == 1 else many


def _list(minors: Iterable[int]) -> str:
    return ", ".join(str(m) for m in minors)
