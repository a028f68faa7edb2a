"""The running pods preemption may weigh, read from the watch cache's pod entries.

Bound, active pods that are not already being deleted, with their priority and gang (kept on the
cache's pod entries) and the PodDisruptionBudgets selecting them (budgets.py). Pods with an entry
in the hold ledger (binds in flight, gang holds) are never among them: what a gang's plan holds is
not kube-scheduler's to take. The extender's preempt verb and gang preemption both list them
here, each from its own view of the cache.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping

from allocator.core.gang.victims import Candidate
from allocator.runtime.cache.budgets import DisruptionBudgets
from allocator.runtime.cache.records import PodEntry


def candidates_near(
    pods: Mapping[str, PodEntry],
    reserved: Container[str],
    nodes: Iterable[str],
    budgets: DisruptionBudgets | None = None,
) -> list[Candidate]:
    """The candidates on `nodes`, plus every pod of a gang one of them belongs to (wherever it
    runs), so a gang is only ever weighed whole. `reserved`: the keys the ledger holds for."""
    wanted = set(nodes)
    pool = all_candidates(pods, reserved, budgets)
    near = [c for c in pool if c.node in wanted]
    gangs = {c.gang for c in near if c.gang}
    return near + [c for c in pool if c.node not in wanted and c.gang in gangs]


def all_candidates(
    pods: Mapping[str, PodEntry], reserved: Container[str], budgets: DisruptionBudgets | None = None
) -> list[Candidate]:
    out = []
    for e in pods.values():
        if e.holds and not e.deleting and e.key not in reserved:
            guard = budgets.selecting(e.key.partition("/")[0], e.labels) if budgets else ()
            out.append(Candidate(e.key, e.node, e.priority, e.gang, e.uid, guard))
    return out
