"""The migration lifecycle (core/defrag/migration.py): what happens next to each move in flight,
and which planned moves the limits let start."""

from __future__ import annotations

import dataclasses

from allocator.core.defrag.inputs import DefragPlanSettings
from allocator.core.defrag.migration import Evict, Finish, Hold, Limits, Migration, Report, Reserve, step
from allocator.core.defrag.plan import DefragPlan, plan_defrag
from tests.core.defrag.world import World, gang


def planned(per_node: int = 2, nodes: int = 4) -> DefragPlan:
    w = World(nodes)
    for i in range(nodes):
        for g in range(per_node):
            w.run(f"ns{i % 2}/web{i}-{g}", f"n{i}", [g])
    return plan_defrag(w.cluster, [gang("big", 1, 8)], w.facts, DefragPlanSettings())


def migration(
    pod: str, *, phase: str = "", created: float = 0.0, evicted: bool = False, present: bool = True
) -> Migration:
    return Migration(
        f"defrag-{pod}", pod, "uid", "ns/ReplicaSet/web", "n0", "n1", phase, created, evicted, present
    )


def test_a_dry_run_reports_every_move_and_reserves_nothing() -> None:
    plan = planned()
    actions = step([], plan, Limits(max_migrating=1), 0.0, dry_run=True)
    assert [type(a) for a in actions] == [Report] * len(plan.moves) and len(plan.moves) == 2


def test_limits_cap_moves_in_flight() -> None:
    plan = planned()
    assert [type(a) for a in step([], plan, Limits(max_migrating=1), 0.0, dry_run=False)] == [Reserve, Hold]
    both = step([], plan, Limits(max_migrating=5, per_workload=5), 0.0, dry_run=False)
    assert [type(a) for a in both] == [Reserve, Reserve]
    busy = [migration("other/x", phase="Available", evicted=True)]
    held = step(busy, plan, Limits(max_migrating=1), 0.0, dry_run=False)
    assert [type(a) for a in held] == [Hold, Hold] and "maxMigrating 1" in held[0].why  # type: ignore[union-attr]


def test_per_namespace_per_workload_and_window() -> None:
    plan = planned()
    ns = plan.moves[0].key.partition("/")[0]
    inflight = [migration(f"{ns}/y", phase="Pending")]
    got = step(inflight, plan, Limits(max_migrating=9, per_namespace=1, per_workload=9), 1.0, dry_run=False)
    assert [type(a) for a in got] == [Hold, Hold] and "perNamespace" in got[0].why  # type: ignore[union-attr]
    done = [migration("z/done", phase="Succeeded", created=0.0)]
    got = step(done, plan, Limits(max_migrating=9, per_workload=9, per_window=1), 10.0, dry_run=False)
    assert [type(a) for a in got] == [Hold, Hold] and "perWindow" in got[0].why  # type: ignore[union-attr]


def test_an_available_room_evicts_its_pod_once() -> None:
    ready = migration("ns0/web0-0", phase="Available")
    assert step([ready], DefragPlan((), (), (), (), 0, 0), Limits(), 5.0, dry_run=False) == [Evict(ready)]
    gone = migration("ns0/web0-0", phase="Available", evicted=True, present=False)
    assert step([gone], DefragPlan((), (), (), (), 0, 0), Limits(), 5.0, dry_run=False) == []


def test_a_pod_with_a_move_in_flight_is_never_moved_twice() -> None:
    plan = planned()
    first = plan.moves[0]
    inflight = [migration(first.key, phase="Pending", created=0.0)]
    got = step(inflight, plan, Limits(max_migrating=9, per_namespace=9, per_workload=9), 1.0, dry_run=False)
    assert [a.move.key for a in got if isinstance(a, Reserve)] == [plan.moves[1].key]


def test_stuck_and_finished_moves_are_cleaned_up() -> None:
    limits = Limits(reserve_timeout=60, window=100)
    empty = DefragPlan((), (), (), (), 0, 0)
    slow = migration("a/p", phase="Pending", created=0.0)
    assert step([slow], empty, limits, 61.0, dry_run=False) == [Finish(slow, "TimedOut")]
    left = migration("a/q", phase="", created=50.0, present=False)
    assert step([left], empty, limits, 61.0, dry_run=False) == [Finish(left, "PodGone")]
    done = migration("a/r", phase="Succeeded", created=0.0, evicted=True, present=False)
    assert step([done], empty, limits, 99.0, dry_run=False) == []  # kept: it counts in the window
    assert step([done], empty, limits, 100.0, dry_run=False) == [Finish(done, "Done")]
    closed = dataclasses.replace(done, closed=True)
    assert step([closed], empty, limits, 200.0, dry_run=False) == []


def test_a_workloads_own_cap_below_the_setting_holds_its_moves() -> None:
    plan = planned()
    workload = plan.moves[0].workload
    assert workload and all(m.workload == workload for m in plan.moves)
    caps = {workload: (1, "Deployment maxUnavailable")}
    got = step([], plan, Limits(max_migrating=9, per_workload=5), 0.0, dry_run=False, caps=caps)
    assert [type(a) for a in got] == [Reserve, Hold]
    assert "(Deployment maxUnavailable 1)" in got[1].why  # type: ignore[union-attr]
    # A cap of its own above the setting changes nothing: the lower one holds.
    loose = step(
        [], plan, Limits(max_migrating=9, per_workload=1), 0.0, dry_run=False, caps={workload: (4, "x")}
    )
    assert [type(a) for a in loose] == [Reserve, Hold] and "perWorkload 1" in loose[1].why  # type: ignore[union-attr]
    zero = step(
        [], plan, Limits(max_migrating=9, per_workload=5), 0.0, dry_run=False, caps={workload: (0, "z")}
    )
    assert [type(a) for a in zero] == [Hold, Hold]
