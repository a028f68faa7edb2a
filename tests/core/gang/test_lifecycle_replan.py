"""A refused eviction re-plans the gang's preemption around the pods that cannot go (making_room.py
`replan`), without any I/O: the hold moves to a placement whose victims leave them out and break
no PodDisruptionBudget; without one the refused eviction is asked again, and the search is
repeated only when something changed."""

from __future__ import annotations

from allocator.core.actions import Count, WriteStatus
from allocator.core.gang.actions import ClearHold, RecordHold, ReleaseHolds
from allocator.core.gang.victims import Candidate
from allocator.core.gang.view import Outcomes
from tests.core.gang.world import NOW, FakePlanner, condition, eviction, gang, later, member, reports, run

PROTECTED = Candidate("ns/v1", "n1", 0, "", "uid-v1")
OTHER = Candidate("ns/v2", "n2", 0, "", "uid-v2")
PDB = "a PodDisruptionBudget allows no disruption now"
HOLDS = {"ns/m0": "uid-m0"}


def high(name: str) -> object:
    return member(name, priority=10)


def started() -> tuple[FakePlanner, object]:
    """The gang holds room for evicting v1; since then v2 could make room too."""
    planner = FakePlanner(
        free=0, victims={"ns/v1"}, running_pods=[PROTECTED, OTHER], present={"ns/v1", "ns/v2"}
    )
    first = run(gang(high("m0"), min_member=1), planner)  # type: ignore[arg-type]
    assert eviction("ns/g", PROTECTED) in first.actions
    planner.victims = {"ns/v1", "ns/v2"}
    return planner, first.state


def refused(planner: FakePlanner, state: object, *, generation: int = 1, seconds: float = 1) -> object:
    view = gang(
        high("m0"),  # type: ignore[arg-type]
        min_member=1,
        holds=HOLDS,
        generation=generation,
        outcomes=Outcomes(evictions={"ns/v1": PDB}),
    )
    return run(view, planner, state, later(NOW, seconds))


def test_a_refused_eviction_moves_the_hold_to_victims_that_can_go() -> None:
    planner, state = started()
    got = refused(planner, state)
    asked = planner.called("plan_with_preemption")[-1]
    assert [key for key, _ in asked] == ["ns/v2"]  # the refused pod is no candidate any more
    assert planner.released[-1] == ReleaseHolds(("ns/m0",), force=True)  # the old hold goes...
    assert [h.key for h in planner.reserved[-1].holds] == ["ns/m0"]  # ...and the new one is held
    p = got.state.preempting
    assert p is not None and set(p.victims) == {"ns/v2"} and p.refused == {"ns/v1"} and p.blocked == {}
    assert eviction("ns/g", OTHER) in got.actions and eviction("ns/g", PROTECTED) not in got.actions
    assert ClearHold("ns/m0", "uid-m0") in got.actions  # the old record, then the new one
    (record,) = [a for a in got.actions if isinstance(a, RecordHold)]
    assert record.record.victims == {"ns/v2": "uid-v2"} and record.record.plan == got.state.record
    assert Count("preemptions", "replanned") in got.actions
    (event,) = [note for reason, note in reports(got.actions) if reason == "GangPreempting"]
    assert event.startswith(f"eviction of 1 pod(s) refused ({PDB}): re-planned around them; preempting 1")
    status = next(a for a in got.actions if isinstance(a, WriteStatus)).status
    preempting = condition(status, "Preempting")
    assert preempting["status"] == "True"
    assert preempting["message"] == (
        "1 lower-priority pod(s) evicted for the gang; re-planned around 1 pod(s) whose eviction was refused"
    )
    assert got.state.reason == ""  # not waiting on the refusal any more


def test_victims_that_break_a_budget_are_no_way_around() -> None:
    planner, state = started()
    protected_too = Candidate("ns/v2", "n2", 0, "", "uid-v2", budgets=(("ns/pdb", 0),))
    planner.running_pods = [PROTECTED, protected_too]
    got = refused(planner, state)
    assert planner.released == [] and len(planner.reserved) == 1  # the hold stays
    assert eviction("ns/g", PROTECTED) in got.actions  # asked again
    p = got.state.preempting
    assert p is not None and set(p.victims) == {"ns/v1"} and p.refused == {"ns/v1"}
    assert got.state.wait_code == "Preempting"
    assert got.state.reason.endswith("no placement around the refused pods keeps every budget: asking again")
    searches = len(planner.called("plan_with_preemption"))
    refused(planner, got.state, seconds=2)  # nothing changed: no new search
    assert len(planner.called("plan_with_preemption")) == searches
    refused(planner, got.state, generation=2, seconds=3)  # the watch reported something: look again
    assert len(planner.called("plan_with_preemption")) == searches + 1


def test_no_replan_without_a_refusal_or_for_a_starvation_hold() -> None:
    planner, state = started()
    view = gang(high("m0"), min_member=1, holds=HOLDS)  # type: ignore[arg-type]
    searches = len(planner.called("plan_with_preemption"))
    run(view, planner, state, later(NOW, 1))
    assert len(planner.called("plan_with_preemption")) == searches


def test_a_refused_pod_whose_budget_allows_again_is_asked_again_not_planned_around() -> None:
    planner, state = started()
    planner.running_pods = [Candidate("ns/v1", "n1", 0, "", "uid-v1", budgets=(("ns/pdb", 1),)), OTHER]
    got = refused(planner, state)
    assert planner.released == []  # the hold stays where it is
    assert eviction("ns/g", PROTECTED) in got.actions
    p = got.state.preempting
    assert p is not None and set(p.victims) == {"ns/v1"} and p.refused == frozenset()


def test_when_room_needs_no_victims_any_more_the_members_go() -> None:
    planner, state = started()
    planner.free = 1  # something finished elsewhere: the gang fits without preempting
    got = refused(planner, state)
    assert planner.released[-1] == ReleaseHolds(("ns/m0",), force=True)
    assert got.state.preempting is None and set(got.state.plan) == {"ns/m0"}
    assert Count("preemptions", "room_made") in got.actions
    assert any(type(a).__name__ == "Ungate" for a in got.actions)
    (event,) = [note for reason, note in reports(got.actions) if reason == "GangPlanned"]
    assert event == f"eviction of 1 pod(s) refused ({PDB}); room without them now: releasing the members"
