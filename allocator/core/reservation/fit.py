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

_AMPLE = 2**61  # a node without rooms holding cpu or memory: kube-scheduler's to judge


def _holds_rooms(state: NodeState) -> bool:
    return any(is_room(key) and (e.cpu_milli or e.memory) for key, e in state.pods.items())


def _cpu_headroom(state: NodeState) -> int:
    """Free cpu (milli) counting rooms, on nodes with rooms holding cpu or memory; -1 once the
    pod slots are gone (every pod is short then)."""
    if not _holds_rooms(state):
        return _AMPLE
    if state.allocatable.get(rn.PODS, _AMPLE) - state.pod_count < 1:
        return -1
    return state.cpu_free_milli


def _memory_headroom(state: NodeState) -> int:
    return state.memory_free if _holds_rooms(state) else _AMPLE


CPU_HEADROOM = Feature("room_cpu_headroom", _cpu_headroom, raw=True)
MEMORY_HEADROOM = Feature("room_memory_headroom", _memory_headroom, raw=True)


def short_of_rooms(cluster: ClusterState, req: PodRequest, names: Sequence[str]) -> dict[str, Rejection]:
    """The named nodes that hold rooms with cpu or memory and lack cpu, memory or a pod slot for
    `req` once those rooms are counted, with kube-scheduler's reason."""
    if not names:
        return {}
    table = cluster.table
    slots = table.slots_of(names)  # the filter's own lookup, remembered for it
    at = np.where(slots >= 0, slots, 0)
    short = (table.feature(CPU_HEADROOM)[at] < req.cpu_milli) | (
        table.feature(MEMORY_HEADROOM)[at] < req.memory
    )
    short &= slots >= 0
    if not short.any():
        return {}
    out = {}
    for name in compress(names, short.tolist()):
        why = resources_fit(cluster.nodes[name], req)
        if why is not None:
            out[name] = why
    return out
