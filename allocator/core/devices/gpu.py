"""GPU choice (protocol 8.3 and 9): the partition table, then the scope walk (an NVLink domain
first for multi-GPU pods), then plain per-device selection."""

from __future__ import annotations

from collections.abc import Mapping

from allocator.core import reasons as rs
from allocator.core.devices.context import Ctx, Pick, device_score, minor_list
from allocator.core.devices.gpu_set_pick import pick_gpu_set
from allocator.core.devices.handler import UNDECIDED, Undecided
from allocator.core.devices.messages import (
    beyond_node,
    gpu_shortage,
    partition_shortage,
    scope_label,
    scope_shortage,
)
from allocator.core.devices.plain import pcie_scopes, select_plain
from allocator.core.node.features import Feature
from allocator.core.node.gpu_features import FITS_SHARE, FITS_WHOLE
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.inventory import LEVEL_DEVICE, DeviceSlot, NodeInventory, Scope
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.pod_request import GPURequirement, PodRequest, Resources
from apis import keys
from apis import resources as rn
from apis.quantity import Format, Quantity

GPU = rn.DeviceType.GPU

_BINPACK_WEIGHTS = ((8, 10000), (4, 100), (2, 1))


def allocate_gpu(
    ctx: Ctx, desired: int, max_count: int, *, need_picks: bool
) -> Rejection | tuple[list[Pick], str]:
    g = ctx.req.gpu
    assert g is not None
    inv, view = ctx.inv, ctx.view
    feasible, healthy, used = view.gpu_masks(g)
    gpu_hint = ctx.req.hint(GPU)
    has_selector = gpu_hint is not None and gpu_hint.selector is not None

    preferred = _preferred(ctx, g, feasible, desired)
    if preferred is not None:
        return preferred, "preferred"

    # Partitions: mandatory when the pod or the node honours them, else only a first try, except
    # where NVLink differs between pairs: there the set chooser sees all a table says and more.
    by_sets = inv.gpu_sets and not g.shared
    honor = g.honor_partition or inv.partition_honor
    if not g.shared and (honor or not by_sets):
        result = _by_partition(ctx, g, used, healthy, honor)
        if isinstance(result, Rejection):
            return result
        if result is not None:
            return [Pick(m, g.per_gpu) for m in result], "partition"

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
            best, scope = largest_in_scopes(inv, feasible, level)
            if best >= g.count:
                return [], "topology"
            if level:
                return scope_shortage(g, best, scope)
            return gpu_shortage(g, feasible.bit_count(), selector=has_selector)
        if by_sets:
            picks = pick_gpu_set(ctx, g, feasible, used, level)
            if picks is not None:
                return picks, "topology"
            picked = None
        else:
            picked = _walk_with_nvlink(ctx, g, feasible, used, level)
        if picked is not None:
            scope, minors = picked
            ctx.note(f"GPUs {minor_list(minors)} from the scope tree ({scope_label(scope)})")
            return [Pick(m, g.per_gpu) for m in minors], "topology"
        if level:
            best, scope = largest_in_scopes(inv, feasible, level)
            return scope_shortage(g, best, scope)
        # Koordinator stops with "Insufficient GPU Devices" here; the plain path below is what a
        # failed walk without a required scope can still satisfy (see docs/compatibility.md).

    if not need_picks:
        if feasible.bit_count() >= desired:
            return [], "plain"
        return gpu_shortage(g, feasible.bit_count(), selector=has_selector)
    picks = select_plain(ctx, GPU, g.per_gpu, desired, max_count, frozenset())
    if isinstance(picks, Rejection):
        return gpu_shortage(g, feasible.bit_count(), selector=has_selector)
    return picks, "plain"


def _preferred(ctx: Ctx, g: GPURequirement, feasible: int, desired: int) -> list[Pick] | None:
    """The GPUs the node score assumed for a shared pod, when every one is a feasible candidate.
    Whole-GPU pods keep the partition table and the scope walk: any fully free GPU leaves the
    same fragmentation, so topology decides."""
    prefer = ctx.prefer
    if not prefer or not g.shared or len(prefer) != desired or g.scope_level:
        return None
    mask = 0
    for minor in prefer:
        mask |= 1 << minor
    if feasible & mask != mask:
        return None
    ctx.note(f"GPU {minor_list(prefer)}: the one the node score assumed")
    return [Pick(m, g.per_gpu) for m in prefer]


def feasible_partitions(
    groups: tuple, g: GPURequirement, used: int, healthy: int, scopes: tuple[int, ...] | None = None
) -> list:
    """Free partitions of the first group that has any (only the first group when Restricted).
    With `scopes` (a required topology scope), a partition must also lie inside one of them."""
    feasible = []
    for group in groups:
        for part, mask in group.partitions:
            if mask & used or mask & ~healthy:
                continue
            if scopes is not None and not any(mask & ~scope == 0 for scope in scopes):
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
    ctx: Ctx, g: GPURequirement, used: int, healthy: int, honor: bool
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
    level = 0 if g.scope_level == LEVEL_DEVICE else g.scope_level
    scopes = None
    if level:
        by_level = ctx.inv.scopes_by_level
        scopes = tuple(s.mask for lvl in sorted(by_level) if lvl >= level for s in by_level[lvl])
    feasible = feasible_partitions(groups, g, used, healthy, scopes)
    if not feasible:
        return partition_shortage(g) if honor else None
    if len(feasible) == 1:
        chosen = feasible[0][0]
    else:
        scored = [
            (_binpack_score(index, used | mask, g.count), i, part) for i, (part, mask) in enumerate(feasible)
        ]
        for score, _, part in scored:
            ctx.note(f"partition {minor_list(part.minors)}: bin-pack score {score}")
        chosen = max(scored, key=lambda t: (t[0], -t[1]))[2]
    ctx.note(f"GPUs {minor_list(chosen.minors)} from the partition table")
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


def largest_in_scopes(inv: NodeInventory, feasible: int, level: int) -> tuple[int, Scope | None]:
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
    ctx: Ctx, g: GPURequirement, feasible: int, used: int, level: int
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
    scope: Scope, g: GPURequirement, feasible: int, used: int, level: int, ctx: Ctx, not_empty: int = 0
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
        score = device_score(ctx, GPU, g.per_gpu, m)
        if score > best_score:
            best_minor, best_score = m, score
    if best_minor < 0:
        return None
    return scope.level, not_empty, best_score, scope, (best_minor,)


class GPUHandler:
    """GPUs: one requirement for the pod (`req.gpu`), chosen by `allocate_gpu`."""

    verdict_without_picks = True

    def admit(self, state: NodeState, req: PodRequest) -> Rejection | None:
        g = req.gpu
        return isolation_refusal(state, req) if g is not None and g.shared else None

    def quick_verdict(self, state: NodeState, req: PodRequest) -> Rejection | Undecided | None:
        """GPU-only requests without hints: decided from the node's GPU bitmasks alone. Mirrors
        `allocate_gpu`'s verdict exactly (the property tests hold the two together)."""
        g = req.plain_gpu
        inv = state.inventory
        if g is None or inv is None or not inv.gpu_mask:
            return UNDECIDED
        gpus = GPUSummary.of(state)
        if g.shared:
            if req.isolation_provider and (refused := isolation_refusal(state, req)) is not None:
                return refused
            if g.count == 1 and g.equal_share is not None:
                # One GPU with x% of compute and of memory: the node's best GPU decides.
                return None if gpus.max_share >= g.equal_share else gpu_shortage(g, 0, selector=False)
        honor = not g.shared and (g.honor_partition or inv.partition_honor)
        if (too_many := beyond_node(g, inv.gpu_mask.bit_count(), partitions=honor)) is not None:
            return too_many
        if honor:
            return UNDECIDED
        feasible = gpus.whole_mask if g.whole else gpus.fit_mask(g.per_gpu)
        available = feasible.bit_count()
        if available >= g.count:
            return None
        if not g.shared and inv.partitions is not None:
            groups = inv.partitions.get(g.count)
            if groups and feasible_partitions(groups, g, gpus.used_mask, inv.gpu_healthy_mask):
                return None
        return gpu_shortage(g, available, selector=False)

    def grouping(self, req: PodRequest) -> Feature | None:
        # Keep in step with `quick_verdict`: these features name exactly what it reads, and, for
        # whole GPUs on a node that honours partitions, what `allocate_gpu` reads.
        g = req.plain_gpu
        if g is not None:
            if g.shared and g.count == 1 and g.equal_share is not None:
                return FITS_SHARE
            if g.whole:
                return FITS_WHOLE
        return None

    def demand(self, ctx: Ctx, resources: Resources) -> tuple[Resources, int] | Rejection:
        g = ctx.req.gpu
        assert g is not None
        if g.scope_level == LEVEL_DEVICE and g.count > 1:
            return Rejection(
                rs.UNSATISFIABLE_DEVICE_SCOPE,
                f"requiredTopologyScope Device holds one GPU; the pod asks for {g.count}",
                True,
            )
        honor = not g.shared and (g.honor_partition or ctx.inv.partition_honor)
        too_many = beyond_node(g, ctx.inv.gpu_mask.bit_count(), partitions=honor)
        return too_many if too_many is not None else (g.per_gpu, g.count)

    def choose(
        self, ctx: Ctx, per: Resources, desired: int, pcies: frozenset[str], *, need_picks: bool
    ) -> tuple[list[Pick], str] | Rejection:
        # A GPU count is the pod's request, never stretched to cover a joint primary's switches
        # (Koordinator would hand out extra cards); SamePCIe is then checked as for any type.
        return allocate_gpu(ctx, desired, desired, need_picks=need_picks)

    def joint_scopes(self, inv: NodeInventory, picks: list[Pick]) -> frozenset[str]:
        return pcie_scopes(inv, GPU, picks)

    def resources(self, chosen: dict[str, int], slot: DeviceSlot | None) -> dict[str, Quantity]:
        res = chosen if slot is None else with_gpu_memory(chosen, slot.total.get(rn.GPU_MEMORY, 0))
        return {
            n: Quantity.of(v, Format.BINARY_SI if n == rn.GPU_MEMORY else Format.DECIMAL_SI)
            for n, v in res.items()
        }


def isolation_refusal(state: NodeState, req: PodRequest) -> Rejection | None:
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


def with_gpu_memory(res: dict[str, int], total_memory: int) -> dict[str, int]:
    """fillGPUTotalMem: derive the missing one of gpu-memory and gpu-memory-ratio from the GPU's size."""
    has_mem, has_ratio = rn.GPU_MEMORY in res, rn.GPU_MEMORY_RATIO in res
    if has_mem and has_ratio:
        return res
    if has_mem:
        ratio = int(res[rn.GPU_MEMORY] / total_memory * 100) if total_memory else 0
        return {**res, rn.GPU_MEMORY_RATIO: ratio}
    return {**res, rn.GPU_MEMORY: res.get(rn.GPU_MEMORY_RATIO, 0) * total_memory // 100}
