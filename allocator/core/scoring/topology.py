"""Topology quality of the GPUs a multi-GPU pod would get on a node.

Tiers, best first: all GPUs in one NVLink domain (100), behind one PCIe switch (75), on one NUMA
node (50), on one socket (25), spread across sockets (0). Computed from the node's bitmasks: the
best tier that the free GPUs allow, which is the set the allocator prefers (an NVLink domain
first, then the deepest scope). Single-GPU and shared requests are not ranked (None).
"""

from __future__ import annotations

from collections.abc import Callable

from allocator.core.node.features import USAGE
from allocator.core.node.gpu_features import TOPOLOGY_WHOLE
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.inventory import LEVEL_NUMA, LEVEL_PCIE, NodeInventory
from allocator.core.node.state import NodeState
from allocator.core.request.pod_request import PodRequest
from allocator.core.scoring.grouped import GroupedScore, by_feature

NVLINK, PCIE, NUMA, SOCKET, CROSS = 100, 75, 50, 25, 0


def topology_score(state: NodeState, req: PodRequest) -> float | None:
    g = req.gpu
    inv = state.inventory
    if g is None or g.count < 2 or g.shared or inv is None:
        return None
    return _tier(state, inv, GPUSummary.of(state).fit_mask(g.per_gpu), g.count)


def prepare_topology(req: PodRequest) -> Callable[[NodeState], float | None] | None:
    g = req.gpu
    if g is None or g.count < 2 or g.shared:
        return None
    per_gpu, count, whole = g.per_gpu, g.count, g.whole

    def score(state: NodeState) -> float | None:
        inv = state.inventory
        if inv is None:
            return None
        gpus = GPUSummary.of(state)
        feasible = gpus.whole_mask if whole else gpus.fit_mask(per_gpu)
        return _tier(state, inv, feasible, count)

    return score


def best_tier(inv: NodeInventory, feasible: int, count: int) -> float:
    """The best tier `count` GPUs taken from the `feasible` bitmask can have (the gang planner
    ranks nodes by it before it places anything)."""
    return _tier(None, inv, feasible, count) if count > 0 else NVLINK


def gpu_set_tier(inv: NodeInventory, mask: int) -> float:
    """The tier of a chosen GPU set (a bitmask of minors): NVLINK when one NVLink domain holds all
    of it, and so on down to CROSS (the GPUs a gang's members share on one node)."""
    return best_tier(inv, mask, mask.bit_count())


_TIERS: dict[tuple[int, int, int], float] = {}


def _tier(state: NodeState | None, inv: NodeInventory, feasible: int, count: int) -> float:
    """Remembered per topology layout: nodes of one machine type share the answers."""
    key = (inv.layout, feasible, count)
    hit = _TIERS.get(key)
    if hit is None:
        if len(_TIERS) > 50_000:
            _TIERS.clear()
        hit = _TIERS[key] = _compute_tier(inv, feasible, count)
    return hit


def _compute_tier(inv: NodeInventory, feasible: int, count: int) -> float:
    if any((feasible & mask).bit_count() >= count for mask in inv.nvlink_domains.values()):
        return NVLINK
    for level, tier in ((LEVEL_PCIE, PCIE), (LEVEL_NUMA, NUMA)):
        if any((feasible & s.mask).bit_count() >= count for s in inv.scopes_by_level.get(level, ())):
            return tier
    if any((feasible & mask).bit_count() >= count for mask in inv.sockets.values()):
        return SOCKET
    return CROSS


def prepare_topology_grouped(req: PodRequest) -> GroupedScore | None:
    """`prepare_topology` with the nodes it cannot tell apart: the tier is remembered per (layout,
    feasible GPUs), which for whole GPUs the layout and the mask of fully free GPUs decide, and
    for a share the inventory and what its GPUs have free."""
    score = prepare_topology(req)
    if score is None:
        return None
    whole = req.gpu is not None and req.gpu.whole
    return GroupedScore(score, by_feature(TOPOLOGY_WHOLE if whole else USAGE))
