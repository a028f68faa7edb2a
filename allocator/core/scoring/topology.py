"""Topology quality of the GPUs a multi-GPU pod would get on a node.

Tiers, best first: all GPUs in one NVLink domain (100), behind one PCIe switch (75), on one NUMA
node (50), on one socket (25), spread across sockets (0). Computed from the node's bitmasks: the
best tier that the free GPUs allow, which is the set the allocator prefers (an NVLink domain
first, then the deepest scope). Single-GPU and shared requests are not ranked (None).

On a node where NVLink differs between GPU pairs (`NodeInventory.gpu_sets`: DGX-1 meshes, bridged
boards, links down) one NVLink domain says little: the GPU set chooser takes the set with the best
bottleneck pair of the node's interconnect matrix, and the tier is that pair's: over NVLink from
PCIE up to NVLINK in proportion to its bandwidth against the node's best pair (plus up to one
point for its PCIe relation, the chooser's tie-break), else its host relation (same switch or
root complex PCIE, NUMA, SOCKET, CROSS). The gang planner rates nodes and plans with the same
tiers (`best_tier`, `gpu_set_tier`).

`prepare_topology_grouped(req, pressure=...)`: for a pod that may run on any GPU model, the tier
counts for nothing on a node whose model is spoken for: its model pressure
(`FragmentationTerm.model_pressure`, the share of that model's idle GPUs that model-constrained
pods are expected to claim) is at least `SPOKEN_FOR`. NVLink is worth having where it costs
nobody, but a pod that could run anywhere should not take the only GPUs a constrained gang can
use: on the topology workload with departures such pods filled the DGX nodes and 8-GPU gangs
constrained to them waited (docs/simulator.md, gang wait).
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
from allocator.core.request.pod_request import PodRequest
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
Pressure = Callable[[NodeState], float]
# Model pressure from which an unconstrained pod gets no topology credit on the model (the rounded
# pressure, in tenths). bench/quality.py, seeds 1-10: gang wait p99 with mean lifetime 600 / NVLink %
# of placed 2-, 4-, 8-GPU pods: no discount 88.4 / 100, 78, 86; tier x (1 - pressure) 0 / 51, 65, 95;
# from 0.6: 0 / 98, 68, 76; 0.7: 0 / 100, 64, 83; 0.8: 22.1 / 98, 82, 78; 0.9: 22.1 / 93, 79, 83.
# At 0.7 no gang waits (as under FGD and BestFit), also with lifetime 1000 (0.9: p99 8.6, a gang
# lost in 2 runs of 10); 4-GPU pods pay most, staying above FGD (62) and BestFit (65).
SPOKEN_FOR = 0.7


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


def prepare_topology_grouped(req: PodRequest, pressure: Pressure | None = None) -> GroupedScore | None:
    """`prepare_topology` with the nodes it cannot tell apart: the tier is remembered per (layout,
    feasible GPUs), which for whole GPUs the layout and the mask of fully free GPUs decide, and
    for a share the inventory and what its GPUs have free. With `pressure` (for a pod that may run
    on any GPU model) the tier is 0 where the node's model is spoken for (`SPOKEN_FOR`), so the
    groups include the model."""
    score = prepare_topology(req)
    if score is None:
        return None
    whole = req.gpu is not None and req.gpu.whole
    group = by_feature(TOPOLOGY_WHOLE if whole else USAGE)
    if pressure is None:
        return GroupedScore(score, group)

    def discounted(state: NodeState) -> float | None:
        tier = score(state)
        if tier is None:
            return None
        return 0.0 if pressure(state) >= SPOKEN_FOR else tier

    def with_model(table: NodeTable, slots: np.ndarray) -> np.ndarray:
        return combine_keys([group(table, slots), table.feature(GPU_MODEL)[slots]])

    return GroupedScore(discounted, with_model)
