"""The migration lifecycle (core/defrag/migration.py): what happens next to each move in flight,
and which planned moves the limits let start."""

from __future__ import annotations

import dataclasses

from allocator.core.actions import Count, Event, Evict
from allocator.core.defrag.inputs import DefragPlanSettings
from allocator.core.defrag.migration import (
    HELD,
    PLANNED,
    Action,
    CloseReservation,
    CreateReservation,
    Limits,
    Migration,
    WorkloadCap,
    held_why,
    pod_ref,
    step,
)
from allocator.core.defrag.plan import DefragPlan, plan_defrag
from tests.core.defrag.world import World, gang


def planned(per_node: int = 2, nodes: int = 4) -> DefragPlan:
    w = World(nodes)
    for i in range(nodes):
        for g in range(per_node):
            w.run(f"ns{i % 2}/web{i}-{g}", f"n{i}", [g])
    return plan_defrag(w.cluster, [gang("big", 1, 8)], w.facts, DefragPlanSettings())


def migration(
    pod: str,
    *,
    phase: str = "",
    created: float = 0.0,
    evicted: bool = False,
    present: bool = True,
    ready: bool = False,
    workload: str = "ns/ReplicaSet/web",
    expires: float = float("inf"),
) -> Migration:
    return Migration(
        f"defrag-{pod}", pod, "uid", workload, "n0", "n1", phase, created, evicted, present,
        ready=ready, expires=expires,
    )  # fmt: skip


def kinds(actions: list[Action]) -> list[str]:
    """The steps, a move the limits hold back (an Event and a count) as one "Held", a dry run's
    planned move as one "Planned"."""
    out = []
    for a in actions:
        if isinstance(a, Event):
            out.append({HELD: "Held", PLANNED: "Planned"}[a.reason])
        elif not isinstance(a, Count):
            out.append(type(a).__name__)
    return out


def whys(actions: list[Action]) -> list[str]:
    return [held_why(a.note) for a in actions if isinstance(a, Event) and a.reason == HELD]


def evict(m: Migration) -> Evict:
    return Evict(pod_ref(m.pod, m.uid), m.source, owner=m.reservation)


def test_a_dry_run_reports_every_move_and_reserves_nothing() -> None:
    plan = planned()
    actions = step([], plan, Limits(max_migrating=1), 0.0, dry_run=True)
    assert kinds(actions) == ["Planned"] * len(plan.moves) and len(plan.moves) == 2
    assert [a for a in actions if isinstance(a, Count)] == [Count("moves", "planned")] * 2


def test_limits_cap_moves_in_flight() -> None:
    plan = planned()
    one = step([], plan, Limits(max_migrating=1), 0.0, dry_run=False)
    assert kinds(one) == ["CreateReservation", "Held"] and Count("moves", "held") in one
    both = step([], plan, Limits(max_migrating=5, per_workload=5), 0.0, dry_run=False)
    assert kinds(both) == ["CreateReservation", "CreateReservation"]
    busy = [migration("other/x", phase="Available", evicted=True)]
    held = step(busy, plan, Limits(max_migrating=1), 0.0, dry_run=False)
    assert kinds(held) == ["Held", "Held"] and "maxMigrating 1" in whys(held)[0]


def test_per_namespace_per_workload_and_window() -> None:
    plan = planned()
    ns = plan.moves[0].key.partition("/")[0]
    inflight = [migration(f"{ns}/y", phase="Pending")]
    got = step(inflight, plan, Limits(max_migrating=9, per_namespace=1, per_workload=9), 1.0, dry_run=False)
    assert kinds(got) == ["Held", "Held"] and "perNamespace" in whys(got)[0]
    done = [migration("z/done", phase="Succeeded", created=0.0, ready=True)]
    got = step(done, plan, Limits(max_migrating=9, per_workload=9, per_window=1), 10.0, dry_run=False)
    assert kinds(got) == ["Held", "Held"] and "perWindow" in whys(got)[0]


def test_an_available_room_evicts_its_pod_once() -> None:
    ready = migration("ns0/web0-0", phase="Available")
    assert step([ready], DefragPlan((), (), (), (), 0, 0), Limits(), 5.0, dry_run=False) == [evict(ready)]
    gone = migration("ns0/web0-0", phase="Available", evicted=True, present=False)
    assert step([gone], DefragPlan((), (), (), (), 0, 0), Limits(), 5.0, dry_run=False) == []


def test_a_pod_with_a_move_in_flight_is_never_moved_twice() -> None:
    plan = planned()
    first = plan.moves[0]
    inflight = [migration(first.key, phase="Pending", created=0.0)]
    got = step(inflight, plan, Limits(max_migrating=9, per_namespace=9, per_workload=9), 1.0, dry_run=False)
    assert [a.move.key for a in got if isinstance(a, CreateReservation)] == [plan.moves[1].key]


def test_stuck_and_finished_moves_are_cleaned_up() -> None:
    limits = Limits(reserve_timeout=60, window=100)
    empty = DefragPlan((), (), (), (), 0, 0)
    slow = migration("a/p", phase="Pending", created=0.0)
    assert step([slow], empty, limits, 61.0, dry_run=False) == [CloseReservation(slow, "TimedOut")]
    left = migration("a/q", phase="", created=50.0, present=False)
    assert step([left], empty, limits, 61.0, dry_run=False) == [CloseReservation(left, "PodGone")]
    done = migration("a/r", phase="Succeeded", created=0.0, evicted=True, present=False, ready=True)
    assert step([done], empty, limits, 99.0, dry_run=False) == []  # kept: it counts in the window
    assert step([done], empty, limits, 100.0, dry_run=False) == [CloseReservation(done, "Done")]
    closed = dataclasses.replace(done, closed=True)
    assert step([closed], empty, limits, 200.0, dry_run=False) == []


def test_a_workloads_own_cap_below_the_setting_holds_its_moves() -> None:
    plan = planned()
    workload = plan.moves[0].workload
    assert workload and all(m.workload == workload for m in plan.moves)
    caps = {workload: (WorkloadCap(1, "Deployment maxUnavailable"),)}
    got = step([], plan, Limits(max_migrating=9, per_workload=5), 0.0, dry_run=False, caps=caps)
    assert kinds(got) == ["CreateReservation", "Held"]
    assert "(Deployment maxUnavailable 1)" in whys(got)[0]
    # A cap of its own above the setting changes nothing: the lower one holds.
    loose = step(
        [],
        plan,
        Limits(max_migrating=9, per_workload=1),
        0.0,
        dry_run=False,
        caps={workload: (WorkloadCap(4, "x"),)},
    )
    assert kinds(loose) == ["CreateReservation", "Held"] and "perWorkload 1" in whys(loose)[0]
    zero = step(
        [],
        plan,
        Limits(max_migrating=9, per_workload=5),
        0.0,
        dry_run=False,
        caps={workload: (WorkloadCap(0, "z"),)},
    )
    assert kinds(zero) == ["Held", "Held"]


def test_a_move_is_in_flight_until_its_replacement_runs_ready_on_the_room() -> None:
    plan = planned()
    limits = Limits(max_migrating=1, per_workload=9, window=100)
    # Evicted and gone, its replacement not bound yet (it could not be scheduled at once): in flight.
    gone = migration("other/x", phase="Available", evicted=True, present=False)
    assert not gone.finished(10.0)
    assert kinds(step([gone], plan, limits, 10.0, dry_run=False)) == ["Held", "Held"]
    # Bound on the room (Succeeded), not Ready yet: still in flight.
    bound = dataclasses.replace(gone, phase="Succeeded")
    assert not bound.finished(10.0)
    held = step([bound], plan, limits, 10.0, dry_run=False)
    assert kinds(held) == ["Held", "Held"] and "1 moves in flight (maxMigrating 1)" in whys(held)[0]
    # Ready: done, the next move starts.
    ready = dataclasses.replace(bound, ready=True)
    assert ready.finished(10.0)
    assert kinds(step([ready], plan, limits, 10.0, dry_run=False)) == ["CreateReservation", "Held"]


def test_a_move_whose_room_expired_is_over_and_closed_after_the_window() -> None:
    limits = Limits(max_migrating=1, window=100)
    empty = DefragPlan((), (), (), (), 0, 0)
    stuck = migration("a/p", phase="Succeeded", evicted=True, present=False, expires=400.0)
    assert not stuck.finished(399.0) and stuck.finished(400.0)
    assert step([stuck], empty, limits, 400.0, dry_run=False) == [CloseReservation(stuck, "Expired")]
    failed = migration("a/q", phase="Failed", evicted=True, present=False)
    assert failed.finished(1.0)
    assert step([failed], empty, limits, 100.0, dry_run=False) == [CloseReservation(failed, "Failed")]


def test_a_max_unavailable_counts_the_workloads_pods_down_and_its_moves_in_flight() -> None:
    plan = planned()
    workload = plan.moves[0].workload
    limits = Limits(max_migrating=9, per_namespace=9, per_workload=9)
    # maxUnavailable 2, one pod of the workload down already: one move may start, not two.
    caps = {workload: (WorkloadCap(2, "Deployment maxUnavailable", unavailable=1),)}
    got = step([], plan, limits, 0.0, dry_run=False, caps=caps)
    assert kinds(got) == ["CreateReservation", "Held"]
    assert whys(got) == [f"1 of {workload} moving, 1 unavailable (Deployment maxUnavailable 2)"]
    # Two pods down: none.
    caps = {workload: (WorkloadCap(2, "Deployment maxUnavailable", unavailable=2),)}
    assert kinds(step([], plan, limits, 0.0, dry_run=False, caps=caps)) == ["Held", "Held"]
    # A move of the workload in flight counts too.
    inflight = [migration("other/y", phase="Available", evicted=True, present=False, workload=workload)]
    caps = {workload: (WorkloadCap(2, "Deployment maxUnavailable", unavailable=1),)}
    assert kinds(step(inflight, plan, limits, 0.0, dry_run=False, caps=caps)) == ["Held", "Held"]
    # A budget's allowed disruptions have counted its pods down already: moves alone count.
    budget = {workload: (WorkloadCap(1, "PodDisruptionBudget disruptionsAllowed"),)}
    assert kinds(step([], plan, limits, 0.0, dry_run=False, caps=budget)) == ["CreateReservation", "Held"]
