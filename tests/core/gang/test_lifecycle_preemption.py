"""The lifecycle step's preemption paths (allocator/core/gang/making_room.py) without any I/O: a
victim plan held and evicted for, refusals retried, the room made or given up, the starvation
hold of the queue's head, and a hold continued from the records an earlier leader left."""

from __future__ import annotations

from allocator.core.actions import Count, Evict, Ungate, WriteStatus
from allocator.core.gang.actions import ClearHold, RecordHold, ReleaseHolds
from allocator.core.gang.hold_record import HoldRecord
from allocator.core.gang.making_room import LOWEST
from allocator.core.gang.victims import Candidate
from allocator.core.gang.view import Outcomes
from apis import keys
from apis.timestamps import format_time
from tests.core.gang.world import (
    NOW,
    FakePlanner,
    Rules,
    eviction,
    gang,
    gpus,
    kinds,
    later,
    member,
    reports,
    run,
)

VICTIM = Candidate("ns/v1", "n1", 0, "", "uid-v1")
PDB = "a PodDisruptionBudget allows no disruption now"


def preempting_world() -> FakePlanner:
    """No room; one running pod of priority 0 whose removal makes room for the gang (priority 10)."""
    return FakePlanner(free=0, victims={"ns/v1"}, running_pods=[VICTIM], present={"ns/v1"})


def high(name: str, **kw: object) -> object:
    return member(name, priority=10, **kw)  # type: ignore[arg-type]


def test_a_gang_that_fits_nowhere_holds_the_room_of_its_victims_and_evicts_them() -> None:
    planner = preempting_world()
    m0 = high("m0")
    got = run(gang(m0, min_member=1), planner)
    assert kinds(got.actions) == [
        "Count", "Count", "RecordHold", "Event", "Requeue", "Evict", "TellMembers", "WriteStatus"
    ]  # fmt: skip
    assert got.actions[0] == Count("preemptions", "started") and got.actions[1] == Count("victims", by=1)
    (record,) = [a for a in got.actions if isinstance(a, RecordHold)]
    assert record.member == m0
    assert (record.record.node, record.record.victims, record.record.evict) == (
        "n1",
        {"ns/v1": "uid-v1"},
        True,
    )
    assert record.record.plan == got.state.record and len(got.state.record) == 12
    note = "preempting 1 lower-priority pod(s) on n1 for 1 member(s); the freed devices are held for the gang"
    assert reports(got.actions) == [("GangPreempting", note)]
    assert eviction("ns/g", VICTIM) in got.actions
    assert [h.key for r in planner.reserved for h in r.holds] == ["ns/m0"]  # held while the victims go
    assert not any(isinstance(a, Ungate) for a in got.actions)  # gated until the room is free
    status = next(a for a in got.actions if isinstance(a, WriteStatus)).status
    preempting = next(c for c in status["conditions"] if c["type"] == "Preempting")
    assert (
        preempting["status"] == "True"
        and preempting["message"] == "1 lower-priority pod(s) evicted for the gang"
    )


def test_a_refused_eviction_is_retried_and_said_an_accepted_one_is_not_sent_again() -> None:
    planner = preempting_world()
    view = gang(high("m0"), min_member=1)
    first = run(view, planner)
    holds = {"ns/m0": "uid-m0"}
    refused = run(
        gang(high("m0"), min_member=1, holds=holds, outcomes=Outcomes(evictions={"ns/v1": PDB})),
        planner,
        first.state,
        later(NOW, 1),
    )
    assert eviction("ns/g", VICTIM) in refused.actions
    # no other victims make room: the same eviction is asked again (re-planning: test_lifecycle_replan.py)
    again = "no placement around the refused pods keeps every budget: asking again"
    assert refused.state.reason == f"preempting: eviction refused: {PDB}; {again}"
    assert refused.state.wait_code == "Preempting"
    accepted = run(
        gang(high("m0"), min_member=1, holds=holds, outcomes=Outcomes(evictions={"ns/v1": ""})),
        planner,
        refused.state,
        later(NOW, 2),
    )
    assert not any(isinstance(a, Evict) for a in accepted.actions)
    assert accepted.state.preempting is not None and accepted.state.preempting.blocked == {}


def test_once_the_victims_are_gone_the_members_are_released_and_the_records_cleared() -> None:
    planner = preempting_world()
    first = run(gang(high("m0"), min_member=1), planner)
    planner.present.clear()
    got = run(gang(high("m0"), min_member=1, holds={"ns/m0": "uid-m0"}), planner, first.state, later(NOW, 3))
    assert kinds(got.actions) == [
        "Requeue", "ClearHold", "Count", "Event", "Ungate", "TellMembers", "WriteStatus"
    ]  # fmt: skip
    assert got.actions[1:3] == [ClearHold("ns/m0", "uid-m0"), Count("preemptions", "room_made")]
    assert reports(got.actions) == [("GangPlanned", "the victims are gone; releasing the members")]
    assert [a.pod.name for a in got.actions if isinstance(a, Ungate)] == ["m0"]
    assert got.state.preempting is None and got.state.record == ""
    assert got.state.planned_at == later(NOW, 3).mono  # the bind timeout counts from now


def test_victims_that_do_not_leave_in_time_give_the_room_up() -> None:
    planner = preempting_world()
    first = run(gang(high("m0"), min_member=1), planner)
    view = gang(
        high("m0"), min_member=1, holds={"ns/m0": "uid-m0"}, outcomes=Outcomes(evictions={"ns/v1": PDB})
    )
    got = run(view, planner, first.state, later(NOW, 301), rules=Rules(preemption_timeout=300))
    assert planner.released == [ReleaseHolds(("ns/m0",), force=True)]
    assert ClearHold("ns/m0", "uid-m0") in got.actions and Count("preemptions", "timed_out") in got.actions
    note = f"1 victim(s) did not leave within 300s ({PDB}): the held devices are released"
    assert ("GangPreemptionTimedOut", note) in reports(got.actions)
    assert got.state.plan == {} and got.state.preempting is None


def test_without_preemption_no_victim_plan_is_asked() -> None:
    planner = preempting_world()
    got = run(gang(high("m0"), min_member=1), planner, rules=Rules(preemption=False))
    assert planner.called("plan_with_preemption") == []
    assert got.state.wait_code == "InsufficientResources"


def starving_world() -> tuple[FakePlanner, object]:
    """The victim runs at the gang's priority: preemption cannot take it, a starvation hold waits."""
    same = Candidate("ns/v1", "n1", 10, "", "uid-v1")
    planner = FakePlanner(free=0, victims={"ns/v1"}, running_pods=[same], present={"ns/v1"})
    started = {"scheduleStartTime": format_time(NOW.wall - 700)}
    return planner, gang(high("m0"), min_member=1, status=started)


def test_the_first_waiting_gang_past_the_starvation_bound_holds_room_without_evicting() -> None:
    planner, view = starving_world()
    got = run(view, planner, head=True, rules=Rules(starvation_bound=600))  # type: ignore[arg-type]
    assert got.queued
    asked = planner.called("plan_with_preemption")
    assert [c[0][1] for c in asked] == [10, LOWEST]  # then every running pod counts
    holding = "holding the room on n1 as 1 pod(s) there finish; other pods backfill only devices the gang does not need"
    # The start Event, then the wait it means (the members hear it once: the same kind of news).
    assert reports(got.actions) == [
        ("GangHoldingRoom", f"waited longer than 600s: {holding}"),
        ("GangWaiting", holding),
    ]
    assert not any(isinstance(a, (Evict, Count)) for a in got.actions)
    (record,) = [a for a in got.actions if isinstance(a, RecordHold)]
    assert record.record.evict is False
    assert (got.state.reason, got.state.wait_code) == (holding, "HoldingRoom")


def test_a_gang_behind_the_head_does_not_hold_room() -> None:
    planner, view = starving_world()
    got = run(view, planner, head=False, rules=Rules(starvation_bound=600))  # type: ignore[arg-type]
    assert len(planner.called("plan_with_preemption")) == 1 and planner.reserved == []
    assert got.state.wait_code == "InsufficientResources"


def test_a_new_leader_continues_the_hold_recorded_on_the_members() -> None:
    record = HoldRecord("a1b2c3", "n2", gpus(4, 5), {"ns/v1": "uid-v1", "ns/gone": "uid-gone"}, True)
    annotated = {keys.GANG_HOLD: record.to_json()}
    planner = FakePlanner(free=0, nodes={"ns/v1": "n2"}, present={"ns/v1"})
    got = run(gang(high("m0", annotations=annotated), min_member=1), planner)
    assert planner.called("plan_gang") == []  # not planned afresh
    ((hold,),) = [r.holds for r in planner.reserved]
    assert (hold.key, hold.node, hold.devices) == ("ns/m0", "n2", gpus(4, 5))
    assert ("GangHoldRestored", "continuing the hold on n2 recorded by an earlier leader") in reports(
        got.actions
    )
    assert got.state.record == "a1b2c3"
    evicts = [a for a in got.actions if isinstance(a, Evict)]
    assert evicts == [eviction("ns/g", Candidate("ns/v1", "n2", 0, "", "uid-v1"))]  # the one gone is done
