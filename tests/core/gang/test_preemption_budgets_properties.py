"""PodDisruptionBudget-aware victim selection against a brute-force oracle: the cheapest subset by
violations first (each budget's victims beyond what it allows), then the documented order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from allocator.core.gang.plan import GangPlan, NoPlan, plan_gang
from allocator.core.gang.preemption import PreemptionPlan, plan_with_preemption
from allocator.core.gang.victims import Candidate
from tests.core.gang.test_preemption_properties import (
    PROPS,
    Running,
    build,
    cluster_with,
    members_of,
    oracle_cost,
    oracle_units,
    running_pods,
    subsets,
)

BUDGETS = {"run/pa": 0, "run/pb": 1}  # what each allows now


def oracle_violations(units: tuple[list[Running], ...], covered: dict[str, str]) -> int:
    chosen: dict[str, int] = {}
    for r in (r for u in units for r in u):
        if r.key in covered:
            chosen[covered[r.key]] = chosen.get(covered[r.key], 0) + 1
    return sum(max(0, n - BUDGETS[b]) for b, n in chosen.items())


@PROPS
@given(running_pods, st.integers(1, 2), st.sampled_from([2, 4, 8]), st.sampled_from([5, 10]), st.data())
def test_gang_victims_break_the_fewest_budgets_then_cost_least(
    spec: list[tuple[int, int, int, str]], count: int, size: int, priority: int, data: st.DataObject
) -> None:
    running = build(spec)
    covered = {
        r.key: b for r in running if (b := data.draw(st.sampled_from(["", "", "run/pa", "run/pb"]))) != ""
    }
    cands = [
        Candidate(r.key, r.node, r.priority, r.gang, budgets=((covered[r.key], BUDGETS[covered[r.key]]),))
        if r.key in covered
        else Candidate(r.key, r.node, r.priority, r.gang)
        for r in running
    ]
    members = members_of(count, size, priority, False)
    got = plan_with_preemption(cluster_with(running), members, cands)
    units = oracle_units(running, priority)
    best = None
    for subset in subsets(units):
        gone = {r.key for u in subset for r in u}
        if isinstance(plan_gang(cluster_with(running, gone), members), GangPlan):
            cost = (oracle_violations(subset, covered), *oracle_cost(subset))
            best = cost if best is None or cost < best else best
    if best is None:
        assert isinstance(got, NoPlan)
        return
    assert isinstance(got, PreemptionPlan) and got.exact
    keys = {v.key for v in got.victims}
    chosen = tuple(u for u in units if u[0].key in keys)
    assert sum(len(u) for u in chosen) == len(keys)
    assert (oracle_violations(chosen, covered), *oracle_cost(chosen)) == best
