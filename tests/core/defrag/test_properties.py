"""Properties of every defragmentation plan on random DGX H100 clusters: applied to the cluster it
makes the waiter fit, it moves only pods that may move, it books no GPU twice, and it moves nothing
for a waiter that fits already or that no move unblocks."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.core.defrag.inputs import DefragPlanSettings, why_immovable
from allocator.core.defrag.plan import plan_defrag
from allocator.core.gang.plan import GangPlan, plan_gang
from tests.core.defrag.world import World, gang

OWNERS = ("ReplicaSet", "ReplicaSet", "StatefulSet", "Job", "", "DaemonSet")


@st.composite
def worlds(draw: st.DrawFn) -> tuple[World, int, int, bool]:
    nodes = draw(st.integers(2, 4))
    w = World(nodes)
    for i in range(nodes):
        free = list(range(8))
        for j in range(draw(st.integers(2, 6))):
            size = draw(st.sampled_from((1, 1, 1, 2)))
            if size > len(free):
                break
            minors, free = free[:size], free[size:]
            w.run(
                f"p{i}x{j}",
                f"n{i}",
                minors,
                priority=draw(st.sampled_from((0, 0, 10, 500))),
                owner=draw(st.sampled_from(OWNERS)),
                started=float(draw(st.integers(0, 10)) * 3600),
                gang=draw(st.sampled_from(("", "", "", "ns/g"))),
                protected=draw(st.booleans()) and draw(st.booleans()),
            )
    members, each = draw(st.sampled_from(((1, 8), (1, 8), (2, 8), (2, 6), (3, 4))))
    return w, members, each, draw(st.booleans())


def gpu_cores_ok(w: World) -> bool:
    for state in w.cluster.nodes.values():
        for used in state.used.get("gpu", {}).values():
            if used.get("koordinator.sh/gpu-core", 0) > 100:
                return False
    return True


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_every_plan_applied_makes_the_waiter_fit(case: tuple[World, int, int, bool]) -> None:
    w, members, each, allow_bare = case
    waiter = gang("w", members, each)
    options = DefragPlanSettings(allow_bare=allow_bare)
    fitted = isinstance(plan_gang(w.cluster, waiter.members), GangPlan)
    plan = plan_defrag(w.cluster, [waiter], w.facts, options, now=36_000.0)
    facts = {f.key: f for f in w.facts}
    if fitted:
        assert plan.moves == () and plan.fits == (waiter.name,)
        return
    if not plan.unblocked:
        assert plan.moves == () and [name for name, _ in plan.stuck] == [waiter.name]
        return
    for m in plan.moves:
        assert why_immovable(facts[m.key], waiter.priority, options) == ""
        assert m.target != m.source == facts[m.key].node
        w.cluster.unassign(m.key)
    for m in plan.moves:
        w.cluster.assign(m.key + "-new", m.target, m.allocation.devices)
    assert gpu_cores_ok(w)
    assert isinstance(plan_gang(w.cluster, waiter.members), GangPlan)
