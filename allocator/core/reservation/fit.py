"""The cpu, memory and pod slots rooms hold, checked for everyone else without a per-node loop.

kube-scheduler counts a node's cpu, memory and pods from its pods and knows nothing of rooms; the
core counts rooms like pods (`room.py`). So a pod that kube-scheduler lets onto a node may still
not fit there once the rooms' cpu and memory are counted. `short_of_rooms` finds those nodes among
a filter call's names with a few vectorised comparisons over `NodeTable` feature columns (re-read
only for the nodes that changed since the last call), and asks `resources_fit` only about the
nodes that fall short: 1,000 rooms cost a filter call microseconds, not a loop over every node.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress

import numpy as np

from allocator.core.cluster.state import ClusterState, resources_fit
from allocator.core.node.features import Feature
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.pod_request import PodRequest
from allocator.core.reservation.room import is_room
from apis import resources as rn

_NO_LIMIT = 2**40


def _rooms_holding(state: NodeState) -> int:
    return sum(1 for key, e in state.pods.items() if is_room(key) and (e.cpu_milli or e.memory))


ROOMS_HOLDING = Feature("rooms_holding_cpu_or_memory", _rooms_holding, raw=True)
CPU_FREE = Feature("cpu_free_milli", lambda s: s.cpu_free_milli, raw=True)
MEMORY_FREE = Feature("memory_free", lambda s: s.memory_free, raw=True)
PODS_FREE = Feature("pod_slots_free", lambda s: s.allocatable.get(rn.PODS, _NO_LIMIT) - s.pod_count, raw=True)


def short_of_rooms(cluster: ClusterState, req: PodRequest, names: Sequence[str]) -> dict[str, Rejection]:
    """The named nodes that hold rooms with cpu or memory and lack cpu, memory or a pod slot for
    `req` once those rooms are counted, with kube-scheduler's reason."""
    if not names:
        return {}
    table = cluster.table
    slots = table.slots_of(names)
    known = slots >= 0
    at = np.where(known, slots, 0)
    holding = known & (table.feature(ROOMS_HOLDING)[at] > 0)
    if not holding.any():
        return {}
    short = holding & (
        (table.feature(CPU_FREE)[at] < req.cpu_milli)
        | (table.feature(MEMORY_FREE)[at] < req.memory)
        | (table.feature(PODS_FREE)[at] < 1)
    )
    if not short.any():
        return {}
    out = {}
    for name in compress(names, short.tolist()):
        why = resources_fit(cluster.nodes[name], req)
        if why is not None:
            out[name] = why
    return out
