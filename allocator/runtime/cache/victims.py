"""The running pods preemption may weigh, read from the watch cache.

Bound, active pods that are not already being deleted, with their priority and gang (kept on the
cache's pod entries). Reservations (binds in flight, gang holds) are never among them: what a
gang's plan holds is not kube-scheduler's to take.
"""

from __future__ import annotations

from collections.abc import Iterable

from allocator.core.gang.victims import Candidate
from allocator.runtime.cache.store import ClusterCache


def candidates_near(cache: ClusterCache, nodes: Iterable[str]) -> list[Candidate]:
    """The candidates on `nodes`, plus every pod of a gang one of them belongs to (wherever it
    runs), so a gang is only ever weighed whole."""
    wanted = set(nodes)
    pool = all_candidates(cache)
    near = [c for c in pool if c.node in wanted]
    gangs = {c.gang for c in near if c.gang}
    return near + [c for c in pool if c.node not in wanted and c.gang in gangs]


def all_candidates(cache: ClusterCache) -> list[Candidate]:
    return [
        Candidate(e.key, e.node, e.priority, e.gang, e.uid)
        for e in cache.pods.values()
        if e.holds and not e.deleting and e.key not in cache.ledger.reservations
    ]
