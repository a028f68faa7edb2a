"""Topology quality of the GPUs a multi-GPU pod would get on a node.

Tiers, best first: all GPUs in one NVLink domain (100), behind one PCIe switch (75), on one NUMA
node (50), on one socket (25), spread across sockets (0). Computed from the node's bitmasks: the
best tier that the free GPUs allow, which is the set the allocator prefers (an NVLink domain
first, then the deepest scope). Shares spread over several GPUs are not ranked (None).

A pod of one GPU (whole or a share of it) needs no link, but it can break one: on a node where it
fits only on a GPU of an NVLink domain that is still wholly free (an A100 board's free NVLink pair,
an untouched DGX), it scores `BREAKS_DOMAIN` (50) instead of 100. Such pods then fill GPUs whose
domain is already broken, and boards without NVLink, before they split the pairs and boards the
2-, 4- and 8-GPU pods need (bench/quality.py, seeds 1-10: NVLink of the placed 2/4/8-GPU pods
86/73/77 -> 100/82/92 %, idle GPU 2.8 -> 3.0 %; at 75 nothing changes, at 0 the 4-GPU pods lose
NUMA locality on the boards the single pods filled and a gang waits with lifetime 1000). A pod of
several GPUs whose best set would split a wholly free domain larger than itself loses a quarter
point (`OPENS_DOMAIN`): between nodes rated alike it packs onto the board already in use.

On a node where NVLink differs between GPU pairs (`NodeInventory.gpu_sets`: DGX-1 meshes, bridged
boards, links down) one NVLink domain says little: the GPU set chooser takes the set with the best
bottleneck pair of the node's interconnect matrix, and the tier is that pair's: over NVLink from
PCIE up to NVLINK in proportion to its bandwidth against the node's best pair (plus up to one
point for its PCIe relation, the chooser's tie-break), else its host relation (same switch or
root complex PCIE, NUMA, SOCKET, CROSS). The gang planner rates nodes and plans with the same
tiers (`best_tier`, `gpu_set_tier`).

`prepare_topology_grouped(req, spoken_for=...)`: for a pod that may run on any GPU model, the
tier counts for nothing on a node where taking its GPUs would take the room that pods held to the
node's model need (`FragmentationTerm.spoken_for`: the gangs held to that model, learned from the
pods placed, would no longer fit, `gang_room.py`). NVLink is worth having where it costs nobody, but a
pod that could run anywhere should not take the only GPUs a constrained gang can use: on the
topology workload with departures such pods filled the DGX nodes and the gangs held to H100
waited (docs/simulator.md, gang wait).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from allocator.core.node.features import USAGE
from allocator.core.node.gpu_features import GPU_MODEL, TOPOLOGY_WHOLE
from allocator.core.node.gpu_pairs import best_sets, tables
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.inventory import LEVEL_NUMA, LEVEL_PCIE, NodeInventory
from allocator.core.node.state import NodeState
from allocator.core.node.table import NodeTable, combine_keys
from allocator.core.request.pod_request import PodRequest, Resources
from allocator.core.scoring.grouped import GroupedScore, by_feature
from apis import interconnect as icx

NVLINK, PCIE, NUMA, SOCKET, CROSS = 100, 75, 50, 25, 0
# A pair's host relation as a tier (no NVLink between the two).
_HOST_TIERS = {
    icx.SAME_SWITCH: PCIE,
    icx.SAME_ROOT: PCIE,
    icx.SAME_NUMA: NUMA,
    icx.SAME_SOCKET: SOCKET,
    icx.CROSS_SOCKET: CROSS,
}
# (node, whole GPUs the pod takes) -> the GPUs are spoken for by pods held to the node's model;
# None while no model keeps room for anyone (the tiers stand as they are)
SpokenFor = Callable[[NodeState, int], bool | None]
# While some model keeps room, a node whose GPUs are not spoken for ranks above one whose are even
# at the lowest tier: without it an 8-GPU pod tied between a spoken-for DGX (0) and an L40S across
# sockets (CROSS, 0), and when the learned mix no longer held the gangs' shapes (no model
# pressure) a hash of the node names decided whether it took the gangs' last room.
NOT_SPOKEN_FLOOR = 1.0


#: What a one-GPU pod scores where it can only take a GPU of a wholly free NVLink domain.
BREAKS_DOMAIN = 50.0
#: Taken off a multi-GPU pod's tier where its best set must split a wholly free NVLink domain: a
#: quarter point, so it decides between nodes rated alike (two DGX boards, one already in use: the
#: pod packs onto that one and leaves the untouched board whole) and not between tiers.
OPENS_DOMAIN = 0.25


def topology_score(state: NodeState, req: PodRequest) -> float | None:
    """The best tier `req`'s GPUs can have on the node (None for fewer than two GPUs or shares):
    what the scorer's value builds on; `prepare_topology` adds what the pod would split."""
    g = req.gpu
    inv = state.inventory
    if g is None or g.count < 2 or g.shared or inv is None:
        return None
    return _tier(state, inv, GPUSummary.of(state).fit_mask(g.per_gpu), g.count)


def prepare_topology(req: PodRequest) -> Callable[[NodeState], float | None] | None:
    g = req.gpu
    if g is not None and g.count == 1:
        return _keeps_domains(g.per_gpu, g.whole)
    if g is None or g.count < 2 or g.shared:
        return None
    per_gpu, count, whole = g.per_gpu, g.count, g.whole

    def score(state: NodeState) -> float | None:
        free = _free(state, per_gpu, whole)
        if free is None:
            return None
        inv, gpus, feasible = free
        tier = _tier(state, inv, feasible, count)
        intact = _intact(inv, gpus.whole_mask, count)
        if intact & feasible and _tier(state, inv, feasible & ~intact, count) < tier:
            return tier - OPENS_DOMAIN  # its best set splits a domain nobody uses yet
        return tier

    return score


def _free(state: NodeState, per_gpu: Resources, whole: bool) -> tuple[NodeInventory, GPUSummary, int] | None:
    """The node's inventory, GPU summary and the mask of GPUs that can take one of the pod's GPUs
    (None without an inventory)."""
    inv = state.inventory
    if inv is None:
        return None
    gpus = GPUSummary.of(state)
    return inv, gpus, gpus.whole_mask if whole else gpus.fit_mask(per_gpu)


def _intact(inv: NodeInventory, whole_free: int, count: int = 1) -> int:
    """The GPUs of the node's NVLink domains larger than `count` whose every GPU is wholly free
    (what a pod of `count` GPUs would split: one that fills a domain does not split it)."""
    out = 0
    for mask in inv.nvlink_domains.values():
        if mask.bit_count() > count and mask & whole_free == mask:
            out |= mask
    return out


def _keeps_domains(per_gpu: Resources, whole: bool) -> Callable[[NodeState], float | None]:
    """One GPU: NVLINK where it fits on a GPU outside every wholly free NVLink domain (a GPU of a
    domain already in use, or one without NVLink), else `BREAKS_DOMAIN`; None without a fit."""

    def score(state: NodeState) -> float | None:
        free = _free(state, per_gpu, whole)
        if free is None or not free[2]:
            return None
        inv, gpus, fit = free
        return NVLINK if fit & ~_intact(inv, gpus.whole_mask) else BREAKS_DOMAIN

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
    ic = inv.interconnect
    if inv.gpu_sets and ic is not None and count > 1:
        return _pair_tier(ic, feasible, count)
    if any((feasible & mask).bit_count() >= count for mask in inv.nvlink_domains.values()):
        return NVLINK
    for level, tier in ((LEVEL_PCIE, PCIE), (LEVEL_NUMA, NUMA)):
        if any((feasible & s.mask).bit_count() >= count for s in inv.scopes_by_level.get(level, ())):
            return tier
    if any((feasible & mask).bit_count() >= count for mask in inv.sockets.values()):
        return SOCKET
    return CROSS


def _pair_tier(ic: icx.Interconnect, feasible: int, count: int) -> float:
    """The tier of the best `count`-set of `feasible` by the interconnect matrix (module doc)."""
    found = best_sets(ic, feasible, count)
    if found is None:
        return CROSS
    (bottleneck, _), sets = found
    mbps, tier = icx.split_value(bottleneck)
    if not mbps:
        return _HOST_TIERS[tier]
    top_mbps = icx.split_value(max(max(row) for row in ic.values))[0]
    _, pcie = tables(ic)
    if pcie is not None:  # the closest PCIe relation among the sets of that quality
        tier = max(icx.split_value(pcie.quality(s)[0])[1] for s in sets)
    return PCIE + (NVLINK - PCIE - 1) * mbps / top_mbps + tier / icx.SAME_SWITCH


def prepare_topology_grouped(req: PodRequest, spoken_for: SpokenFor | None = None) -> GroupedScore | None:
    """`prepare_topology` with the nodes it cannot tell apart: the tier is remembered per (layout,
    feasible GPUs), which for whole GPUs the layout and the mask of fully free GPUs decide, and
    for a share the inventory and what its GPUs have free. With `spoken_for` (for a pod that may
    run on any GPU model) the tier is 0 where the pod's GPUs are spoken for and, while some model
    keeps room, at least `NOT_SPOKEN_FLOOR` elsewhere; that answer depends on the node's model
    and its free GPUs (and on cluster totals, which change the scorer's version), so the groups
    include the model."""
    score = prepare_topology(req)
    if score is None:
        return None
    single = req.gpu is not None and req.gpu.count == 1
    whole = req.gpu is not None and req.gpu.whole and not single  # one GPU reads the used mask too
    group = by_feature(TOPOLOGY_WHOLE if whole else USAGE)
    if spoken_for is None or req.gpu is None or single:  # one GPU: no NVLink credit to withhold
        return GroupedScore(score, group)
    count = req.gpu.count

    def discounted(state: NodeState) -> float | None:
        tier = score(state)
        if tier is None:
            return None
        spoken = spoken_for(state, count)
        if spoken is None:
            return tier
        return 0.0 if spoken else max(tier, NOT_SPOKEN_FLOOR)

    def with_model(table: NodeTable, slots: np.ndarray) -> np.ndarray:
        return combine_keys([group(table, slots), table.feature(GPU_MODEL)[slots]])

    return GroupedScore(discounted, with_model)
