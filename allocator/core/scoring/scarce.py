"""ScarceResourceAvoidance: pods that do not need a scarce resource keep off nodes that have it.

Koordinator's formula over resource kinds: of the kinds the node offers and the pod does not
request, the share that is not scarce (100 when the node offers nothing extra or nothing scarce).
A CPU pod scores lower on a GPU node than on a CPU node, so GPU nodes stay free for GPU pods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from allocator.core.node.features import KINDS
from allocator.core.node.state import NodeState
from allocator.core.request.pod_request import PodRequest
from allocator.core.scoring.grouped import GroupedScore, by_feature

DEFAULT_SCARCE = ("gpu", "rdma", "fpga")


def scarce_score(state: NodeState, req: PodRequest, scarce: Iterable[str]) -> float:
    extra = state.resource_kinds - req.requested_kinds
    scarce_extra = extra.intersection(scarce)
    if not extra or not scarce_extra:
        return 100.0
    return (len(extra) - len(scarce_extra)) * 100 // len(extra)


def prepare_scarce(req: PodRequest, scarce: Iterable[str]) -> Callable[[NodeState], float | None]:
    """`scarce_score` for one request, remembered per set of node resource kinds (nodes of one
    machine type share it)."""
    scarce = tuple(scarce)
    by_kinds: dict[frozenset[str], float] = {}

    def score(state: NodeState) -> float:
        kinds = state.resource_kinds
        value = by_kinds.get(kinds)
        if value is None:
            value = by_kinds[kinds] = scarce_score(state, req, scarce)
        return value

    return GroupedScore(score, by_feature(KINDS))
