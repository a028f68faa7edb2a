"""kube-scheduler's own checks that callers without kube-scheduler model (placement, the simulator):
nodeSelector and required node affinity (NodeAffinity), cpu, memory and the pod count
(NodeResourcesFit), in kube-scheduler's reason strings.

`resources_fit` and `affinity_matches` judge one node. `KubeColumn` holds the verdict of one request
shape for every node slot of the cluster's `NodeTable`, as `columns.VerdictColumn` does for device
fit: a refresh forgets the slots changed since it was last read, and only those are judged again,
so placing the next pod of a shape costs O(changed nodes) of Python plus O(nodes) of numpy instead
of a Python call per node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from allocator.core.cluster.columns import PASS, UNKNOWN, refreshed_codes
from allocator.core.node.state import NodeState
from allocator.core.node.table import NodeTable
from allocator.core.reasons import Rejection
from allocator.core.request.pod_request import PodRequest, SelectorTerm
from apis import node_selector
from apis import resources as rn

AFFINITY = "node(s) didn't match Pod's node affinity/selector"
TOO_MANY_PODS = Rejection("Too many pods", "Too many pods")
INSUFFICIENT_CPU = Rejection("Insufficient cpu", "Insufficient cpu")
INSUFFICIENT_MEMORY = Rejection("Insufficient memory", "Insufficient memory")

# Codes after PASS and UNKNOWN, and what each says (UNKNOWN's message is the caller's).
MESSAGES: tuple[str | None, ...] = (
    None,
    None,
    AFFINITY,
    TOO_MANY_PODS.message,
    INSUFFICIENT_CPU.message,
    INSUFFICIENT_MEMORY.message,
)
_CODE = {AFFINITY: 2, TOO_MANY_PODS.message: 3, INSUFFICIENT_CPU.message: 4, INSUFFICIENT_MEMORY.message: 5}
_NOT_DECIDED = -1


def resources_fit(state: NodeState, req: PodRequest) -> Rejection | None:
    """NodeResourcesFit for cpu, memory and the pod count (kube-scheduler's reason strings)."""
    alloc = state.allocatable
    if rn.PODS in alloc and state.pod_count + 1 > alloc[rn.PODS]:
        return TOO_MANY_PODS
    if req.cpu_milli and req.cpu_milli > alloc.get(rn.CPU, 0) - state.requested_cpu_milli:
        return INSUFFICIENT_CPU
    if req.memory and req.memory > alloc.get(rn.MEMORY, 0) - state.requested_memory:
        return INSUFFICIENT_MEMORY
    return None


def affinity_matches(state: NodeState, req: PodRequest) -> bool:
    labels = state.labels
    if any(labels.get(k) != v for k, v in req.node_selector.items()):
        return False
    if req.affinity_terms is None:
        return True
    return any(term_matches(t, labels, state.name) for t in req.affinity_terms)


def term_matches(term: SelectorTerm, labels: Mapping[str, str], name: str) -> bool:
    """One nodeSelectorTerm against labels, `metadata.name` being `name` (also a Reservation's
    reservationSelectorTerms, core/reservation/match.py)."""
    return node_selector.term_matches(term.expressions, term.fields, labels, name)


def kube_refusal(state: NodeState, req: PodRequest) -> str | None:
    """Why these checks keep the pod off the node, in kube-scheduler's words; None: they pass."""
    if not affinity_matches(state, req):
        return AFFINITY
    short = resources_fit(state, req)
    return short.message if short is not None else None


def kube_shape(req: PodRequest) -> tuple[Any, ...]:
    """What of a request these checks read: pods that agree on it get the same verdicts."""
    return (req.cpu_milli, req.memory, tuple(sorted(req.node_selector.items())), req.affinity_terms)


class KubeColumn:
    """The checks' verdict of one request shape per node slot, as codes into `MESSAGES`. The entry
    after the last slot always holds UNKNOWN, so slot -1 (a name not in the cluster) reads as
    unknown."""

    def __init__(self, req: PodRequest) -> None:
        self.req = req
        self.codes = np.zeros(0, np.int8)
        self.synced = -1

    def codes_for(self, table: NodeTable, slots: np.ndarray) -> np.ndarray:
        """The code of each slot (int8, aligned with `slots`)."""
        self._refresh(table)
        got = self.codes[slots]
        missing = got == _NOT_DECIDED
        if missing.any():
            states, req = table.states, self.req
            for slot in np.unique(slots[missing]).tolist():
                state = states[slot]
                why = kube_refusal(state, req) if state is not None else None
                self.codes[slot] = UNKNOWN if state is None else PASS if why is None else _CODE[why]
            got = self.codes[slots]
        return got

    def _refresh(self, table: NodeTable) -> None:
        self.codes, self.synced = refreshed_codes(self.codes, self.synced, table)
