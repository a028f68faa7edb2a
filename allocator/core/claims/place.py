"""The node for a pod's claims: the same filter and ranking the extender path uses, then the
per-node solve in rank order.

The nodes named (the DRA-mode nodes; or the one node a shared claim already pins the pod to) are
kept where the pod's node selector and affinity match and its cpu, memory and pod slot fit; the
core's verdict column keeps those where the claims' devices fit at all (cached per request shape);
the scorer ranks them (fragmentation, topology, fit) exactly as for an extender pod; the first node
in that order where `solve` finds devices meeting every constraint wins. Claims the solver may
answer on its retries (GPU-NIC pairs, a regrouped attribute) try the refused nodes after, in the
same order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from allocator.core.claims.published import NodeDevices
from allocator.core.claims.solve import ClaimAnswer, solve
from allocator.core.cluster.columns import PASS, UNKNOWN
from allocator.core.cluster.kube_checks import INSUFFICIENT_CPU, INSUFFICIENT_MEMORY, MESSAGES, TOO_MANY_PODS
from allocator.core.cluster.state import UNKNOWN_NODE, ClusterState
from allocator.core.reasons import Rejection
from allocator.core.request.claims import ClaimsRequest
from allocator.core.scoring.device import DeviceScoring
from allocator.core.scoring.scorer import NodeScorer

AFFINITY = Rejection(
    "node(s) didn't match Pod's node affinity/selector",
    "node(s) didn't match Pod's node affinity/selector",
    True,
)
# kube_checks' codes (MESSAGES) as the rejections they stand for.
KUBE_REJECTIONS = {UNKNOWN: UNKNOWN_NODE} | {
    MESSAGES.index(r.message): r for r in (AFFINITY, TOO_MANY_PODS, INSUFFICIENT_CPU, INSUFFICIENT_MEMORY)
}


@dataclass(frozen=True)
class NoPlacement:
    """Why no node can take the claims: a rejection per node looked at."""

    rejections: Mapping[str, Rejection]
    message: str = ""  # said instead of the per-node summary (a gang that does not fit whole)

    def summary(self) -> str:
        """kube-scheduler's way: `0/3 nodes can take the claims: 2 need 4 free GPUs, 1 ...`."""
        if self.message:
            return self.message
        counts = Counter(r.message for r in self.rejections.values())
        parts = ", ".join(f"{n} {msg}" for msg, n in sorted(counts.items(), key=lambda t: (-t[1], t[0])))
        total = len(self.rejections)
        return f"0/{total} nodes can take the claims" + (f": {parts}" if parts else "")


def place(
    cluster: ClusterState,
    creq: ClaimsRequest,
    names: Sequence[str],
    published: Mapping[str, NodeDevices],
    scorer: NodeScorer,
    scoring: DeviceScoring | None,
    *,
    explain: bool = False,
) -> ClaimAnswer | NoPlacement:
    rejections: dict[str, Rejection] = {}
    names = list(names)
    # kube-scheduler's checks as the cluster's cached column per request shape: only the nodes
    # changed since the last pod of this shape are judged again in Python.
    codes = cluster.kube_codes(creq.pod, names)
    if not (codes != PASS).any():
        eligible = names
    else:
        eligible = []
        for name, code in zip(names, codes.tolist(), strict=True):
            if code == PASS:
                eligible.append(name)
            else:
                rejections[name] = KUBE_REJECTIONS[code]
    if not eligible:
        return NoPlacement(rejections)
    passed, failed = cluster.feasible(creq.pod, eligible)
    rejections.update(failed)
    order = cluster.rank(creq.pod, passed, scorer)
    if creq.pairs or creq.regroup is not None:
        # The core's verdict is its first try only: where it fails, the solver's retries (GPUs of
        # one value, GPUs capped to the NICs per switch) may still succeed.
        order += cluster.rank(creq.pod, list(failed), scorer)
    for node in order:
        notes: list[str] | None = [] if explain else None
        got = solve(cluster.nodes[node], creq, published.get(node), scoring=scoring, explain=notes)
        if isinstance(got, ClaimAnswer):
            return got
        rejections[node] = got
    return NoPlacement(rejections)
