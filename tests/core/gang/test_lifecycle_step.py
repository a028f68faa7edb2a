"""The gang lifecycle step (allocator/core/gang/lifecycle.py) without any I/O: situations in, the
new state and the actions out, with a fake planner for the cluster (world.py)."""

from __future__ import annotations

import copy

import pytest

from allocator.core.actions import Event, Nudge, ObjectRef, Requeue, Ungate, WriteStatus
from allocator.core.gang.actions import ReleaseHolds, TellMembers
from allocator.core.gang.levels import Levels
from allocator.core.gang.min_resources import CAPACITY, Shortage
from allocator.core.gang.victims import Candidate
from allocator.core.gang.view import Outcomes
from apis import keys
from apis.timestamps import format_time
from tests.core.gang.world import (
    NOW,
    FakePlanner,
    Rules,
    condition,
    gang,
    kinds,
    later,
    member,
    nudge,
    reports,
    run,
    ungate,
    wake_at,
)

PODGROUP = ObjectRef("ns", "g", kind="PodGroup", api_version="scheduling.x-k8s.io/v1alpha1")


def status_of(actions: list[object]) -> dict[str, object]:
    (write,) = [a for a in actions if isinstance(a, WriteStatus)]
    return write.status


@pytest.mark.parametrize(
    ("members", "reason", "code"),
    [
        ((member("m0"),), "waiting for members: the gang needs at least 2", "WaitingForMembers"),
        (
            (member("m0"), member("m1", gates=("kueue.x-k8s.io/admission",))),
            "1 member(s) wait for other scheduling gates: kueue.x-k8s.io/admission",
            "OtherSchedulingGates",
        ),
    ],
)
def test_a_gang_that_cannot_be_planned_yet_waits_without_asking_the_cluster(
    members: tuple[object, ...], reason: str, code: str
) -> None:
    planner = FakePlanner(free=8)
    got = run(gang(*members), planner)
    assert kinds(got.actions) == ["Event", "TellMembers", "WriteStatus"]
    assert got.actions[0] == Event(PODGROUP, "Warning", "GangWaiting", reason)
    waiting = condition(status_of(got.actions), "Waiting")
    assert (waiting["status"], waiting["reason"], waiting["message"]) == ("True", code, reason)
    assert planner.calls == [] and planner.reserved == []
    assert not got.queued  # it does not take the starvation head from the gangs behind it
    assert got.state.decision is not None and got.state.decision.code == code


def test_an_invalid_podgroup_says_why() -> None:
    got = run(
        gang(member("m0"), member("m1"), problem="PodGroup ns/g is invalid: spec: bad"), FakePlanner(free=8)
    )
    assert reports(got.actions) == [("GangWaiting", "PodGroup ns/g is invalid: spec: bad")]
    assert got.state.wait_code == "InvalidPodGroup"


def test_a_plan_found_is_reserved_whole_then_the_members_are_released() -> None:
    planner = FakePlanner(free=4, domain="topoalloc.io/rack=r1")
    m0, m1 = member("m0"), member("m1", created=1)
    got = run(gang(m0, m1), planner)
    assert kinds(got.actions) == [
        "Count", "Event", "Requeue", "Ungate", "Ungate", "TellMembers", "WriteStatus"
    ]  # fmt: skip
    (reserve,) = planner.reserved
    assert [(h.key, h.uid, h.node) for h in reserve.holds] == [
        ("ns/m0", "uid-m0", "n1"),
        ("ns/m1", "uid-m1", "n1"),
    ]
    assert reserve.gang == "ns/g"
    assert got.actions[1] == Event(
        PODGROUP, "Normal", "GangPlanned", "planned 2 member(s) on n1 (topoalloc.io/rack=r1); releasing them"
    )
    assert got.actions[2] == Requeue("ns/g", 120.0)  # the bind deadline
    assert got.actions[3:5] == [ungate(m0), ungate(m1)]
    assert status_of(got.actions)["phase"] == "Scheduling"
    assert {k: (p.uid, p.node, p.devices) for k, p in got.state.plan.items()} == {
        "ns/m0": ("uid-m0", "n1", 1),
        "ns/m1": ("uid-m1", "n1", 1),
    }
    assert got.queued

    # The next pass, before the watch shows the gates gone: nothing is sent twice.
    again = run(gang(m0, m1, holds={"ns/m0": "uid-m0", "ns/m1": "uid-m1"}), planner, got.state, later(NOW, 1))
    assert kinds(again.actions) == ["Requeue", "TellMembers"]
    assert len(planner.called("plan_gang")) == 1
    # A refused gate removal is sent again.
    refused = Outcomes(gates_refused=frozenset({"ns/m1"}))
    retry = run(
        gang(m0, m1, holds={"ns/m0": "uid-m0", "ns/m1": "uid-m1"}, outcomes=refused), planner, again.state
    )
    assert [a for a in retry.actions if isinstance(a, Ungate)] == [ungate(m1)]


def test_the_step_never_changes_the_state_it_is_given() -> None:
    planner = FakePlanner(free=4)
    first = run(gang(member("m0"), member("m1")), planner)
    before = copy.deepcopy(first.state)
    second = run(gang(member("m0", node="n1"), member("m1", node="n1")), planner, first.state, later(NOW, 2))
    assert first.state == before
    assert second.state.plan == {} and second.state.done


@pytest.mark.parametrize(("gpus_free", "code"), [(2, "InsufficientTopology"), (1, "InsufficientResources")])
def test_no_room_waits_with_the_planner_reason_and_retries_only_when_something_changed(
    gpus_free: int, code: str
) -> None:
    planner = FakePlanner(free=1, gpus_free=gpus_free)
    view = gang(member("m0"), member("m1"))
    got = run(view, planner)
    note = "no placement for 2 more member(s) at once: only 1 of 2 members fit at once"
    assert kinds(got.actions) == ["Count", "Event", "TellMembers", "WriteStatus"]
    assert got.actions[0].metric == "plans" and got.actions[0].label == "no_room"  # type: ignore[union-attr]
    assert got.actions[1] == Event(PODGROUP, "Warning", "GangWaiting", note)
    assert condition(status_of(got.actions), "Waiting")["reason"] == code
    assert status_of(got.actions)["phase"] == "PreScheduling"
    assert planner.reserved == [] and not any(isinstance(a, Ungate) for a in got.actions)
    # Preemption was asked (nothing of a lower priority runs): no victims help.
    assert len(planner.called("plan_with_preemption")) == 1

    same = run(view, planner, got.state, later(NOW, 1))
    assert same.actions == [TellMembers(view, same.state)]  # no search, no repeated Event
    assert len(planner.called("plan_gang")) == 1 and same.queued
    changed = run(gang(member("m0"), member("m1"), generation=2), planner, same.state, later(NOW, 2))
    assert len(planner.called("plan_gang")) == 2
    assert reports(changed.actions) == []  # the same note: one Event


def test_when_only_the_minimum_fits_the_higher_priority_members_go_first() -> None:
    planner = FakePlanner(free=2)
    view = gang(member("low"), member("high", priority=5, created=1), member("mid", priority=1, created=2))
    got = run(view, planner)
    assert planner.called("plan_gang") == [("ns/high", "ns/mid", "ns/low"), ("ns/high", "ns/mid")]
    assert set(got.state.plan) == {"ns/high", "ns/mid"}


def test_a_member_the_cache_has_not_caught_up_with_waits_silently() -> None:
    planner = FakePlanner(free=4, missing={"ns/m1"})
    got = run(gang(member("m0"), member("m1")), planner)
    assert planner.called("plan_gang") == [] and reports(got.actions) == []
    assert got.state.attempt is None  # tried again on the next pass


def test_a_refused_reserve_holds_nothing_and_is_tried_again() -> None:
    planner = FakePlanner(free=4, refuse={"ns/m1"})
    view = gang(member("m0"), member("m1"))
    got = run(view, planner)
    assert len(planner.reserved) == 1 and planner.held == {}  # m0's hold was undone
    assert kinds(got.actions) == ["TellMembers", "WriteStatus"]  # no GangPlanned, no gate removed
    assert got.state.plan == {} and got.state.attempt is None
    planner.refuse.clear()
    again = run(view, planner, got.state, later(NOW, 1))
    assert set(again.state.plan) == {"ns/m0", "ns/m1"}
    assert ("GangPlanned", "planned 2 member(s) on n1; releasing them") in reports(again.actions)


def test_a_member_that_left_releases_the_whole_plan_which_is_made_again_at_once() -> None:
    planner = FakePlanner(free=4)
    m0, m1, m2 = member("m0"), member("m1"), member("m2", created=5)
    first = run(gang(m0, m1), planner)
    # m1 is deleted before it was bound; its replacement m2 arrives.
    got = run(gang(m0, m2, holds={"ns/m0": "uid-m0"}), planner, first.state, later(NOW, 1))
    assert planner.released == [ReleaseHolds(("ns/m0", "ns/m1"))]
    note = (
        "member ns/m1 left before it was bound: the gang's reservations are released and it is planned again"
    )
    assert reports(got.actions)[:2] == [
        ("GangPlanReleased", note),
        ("GangPlanned", "planned 2 member(s) on n1; releasing them"),
    ]
    assert set(got.state.plan) == {"ns/m0", "ns/m2"}


def test_a_plan_not_bound_within_the_bind_timeout_is_released_and_made_again() -> None:
    planner = FakePlanner(free=4)
    # Released without a gate (before a restart): the planned node is annotated instead.
    m0, m1 = member("m0", gated=False), member("m1", gated=False)
    first = run(gang(m0, m1), planner)
    assert [a for a in first.actions if isinstance(a, Nudge)] == [nudge(m0, "n1"), nudge(m1, "n1")]
    holds = {"ns/m0": "uid-m0", "ns/m1": "uid-m1"}
    got = run(gang(m0, m1, holds=holds), planner, first.state, later(NOW, 121), rules=Rules(bind_timeout=120))
    assert planner.released == [ReleaseHolds(("ns/m0", "ns/m1"), force=True)]
    assert reports(got.actions)[0] == (
        "GangPlanReleased",
        "planned members were not bound within 120s (is kube-scheduler calling the topoalloc extender "
        "for them?): the reservations are released and it is planned again",
    )
    assert len(planner.reserved) == 2 and not any(isinstance(a, Nudge) for a in got.actions)  # nudged already


def test_late_members_are_planned_one_at_a_time_each_plan_seeing_the_last() -> None:
    planner = FakePlanner(free=1)
    bound = [member("m0", node="n5"), member("m1", node="n5")]
    view = gang(*bound, member("m2", created=2), member("m3", created=3))
    got = run(view, planner)
    assert planner.called("plan_gang") == [("ns/m2",), ("ns/m3",)]
    assert [h.key for r in planner.reserved for h in r.holds] == ["ns/m2"]
    m3 = ObjectRef("ns", "m3", "uid-m3")
    assert Event(m3, "Warning", "GangWaiting", "only 0 of 1 members fit at once") in got.actions
    assert [a.pod.name for a in got.actions if isinstance(a, Ungate)] == ["m2"]
    assert not any(r == "GangScheduled" for r, _ in reports(got.actions))  # done before it was looked at
    view = gang(*bound, member("m2"), member("m3", created=3), holds={"ns/m2": "uid-m2"}, generation=2)
    again = run(view, planner, got.state)
    assert planner.called("plan_gang")[-1] == ("ns/m3",)  # tried again: something changed
    assert not any(isinstance(a, Event) for a in again.actions)  # m3 was told once


def test_a_gang_gets_its_minimum_bound_scheduled_once_with_its_duration() -> None:
    planner = FakePlanner(free=4)
    first = run(gang(member("m0"), member("m1")), planner)
    got = run(gang(member("m0", node="n1"), member("m1", node="n1")), planner, first.state, later(NOW, 7))
    assert kinds(got.actions) == ["Observe", "Event", "TellMembers", "WriteStatus"]
    assert got.actions[0].value == pytest.approx(7.0)  # type: ignore[union-attr]
    assert got.actions[1] == Event(PODGROUP, "Normal", "GangScheduled", "2 of 2 members are bound")
    assert status_of(got.actions)["phase"] == "Running"
    assert got.state.plan == {}


def test_past_its_timeout_a_gang_fails_once_and_is_not_planned_again() -> None:
    planner = FakePlanner(free=0)
    started = {"scheduleStartTime": format_time(NOW.wall - 30)}
    view = gang(member("m0"), member("m1"), timeout=10, status=started)
    got = run(view, planner)
    assert kinds(got.actions) == ["Count", "Event", "TellMembers", "WriteStatus"]
    assert got.actions[0].metric == "timeouts"  # type: ignore[union-attr]
    note = "no placement for the whole gang within its 10s timeout: no placement found"
    assert got.actions[1] == Event(PODGROUP, "Warning", "GangFailed", note)
    status = status_of(got.actions)
    assert status["phase"] == "Failed" and condition(status, "TimedOut")["status"] == "True"
    assert status["scheduleStartTime"] == started["scheduleStartTime"]
    again = run(view, planner, got.state, later(NOW, 5))
    assert planner.calls == [] and again.actions == [TellMembers(view, again.state)]


def test_a_waiting_gang_names_its_timeout_as_the_next_deadline() -> None:
    started = {"scheduleStartTime": format_time(NOW.wall - 30)}
    got = run(gang(member("m0"), member("m1"), timeout=100, status=started), FakePlanner(free=0))
    assert wake_at("ns/g", NOW.wall - 30 + 100) in got.actions


def test_min_resources_a_gang_cannot_have_wait_without_a_search() -> None:
    short = Shortage("nvidia.com/gpu", 40, 32, CAPACITY)
    lower = [
        _candidate("ns/low", priority=-1),
        _candidate("ns/same", priority=0),
    ]
    planner = FakePlanner(free=8, shortage=short, running_pods=lower)
    got = run(gang(member("m0"), member("m1"), min_resources={"nvidia.com/gpu": "40"}), planner)
    assert planner.called("plan_gang") == []
    assert planner.called("min_resources_shortage") == [(("ns/low",),)]  # only lower-priority pods
    assert got.state.wait_code == "InsufficientResources"
    assert reports(got.actions) == [("GangWaiting", short.message)]


def test_the_podgroup_status_is_written_when_it_changes_or_was_refused() -> None:
    planner = FakePlanner(free=0)
    view = gang(member("m0"))
    first = run(view, planner)
    assert any(isinstance(a, WriteStatus) for a in first.actions)
    quiet = run(view, planner, first.state, later(NOW, 1))
    assert not any(isinstance(a, WriteStatus) for a in quiet.actions)
    refused = gang(member("m0"), outcomes=Outcomes(status_refused=True))
    retry = run(refused, planner, quiet.state, later(NOW, 2))
    assert any(isinstance(a, WriteStatus) for a in retry.actions)


def test_a_gang_without_a_podgroup_reports_on_its_waiting_members() -> None:
    planner = FakePlanner(free=0)
    view = gang(
        member("m0", koordinator=3), member("m1", node="n1", koordinator=3), min_member=3, podgroup=False
    )
    got = run(view, planner)
    note = "gang ns/g: waiting for members: the gang needs at least 3"
    assert got.actions == [Event(ObjectRef("ns", "m0", "uid-m0"), "Warning", "GangWaiting", note)]


def test_a_gang_whose_members_all_left_after_failing_starts_afresh() -> None:
    view = gang(member("m0", phase="Failed"), status={"phase": "Failed"})
    got = run(view, FakePlanner(free=4))
    assert status_of(got.actions)["phase"] == "Pending"
    assert not got.state.failed_reported and got.state.done is False


def test_a_planned_member_that_shows_up_bound_leaves_the_plan() -> None:
    planner = FakePlanner(free=4)
    first = run(gang(member("m0"), member("m1")), planner)
    view = gang(member("m0", node="n1"), member("m1", gated=False), holds={"ns/m1": "uid-m1"})
    got = run(view, planner, first.state, later(NOW, 1))
    assert set(got.state.plan) == {"ns/m1"} and planner.released == []
    assert got.state.nudged == {"ns/m1": "n1"}  # released by us, but kube-scheduler has not come back
    annotated = member("m1", gated=False, annotations={keys.GANG_PLANNED_NODE: "n1"})
    quiet = run(gang(member("m0", node="n1"), annotated, holds={"ns/m1": "uid-m1"}), planner, first.state)
    assert not any(isinstance(a, Nudge) for a in quiet.actions)


def _candidate(key: str, *, priority: int, node: str = "n9") -> Candidate:
    return Candidate(key, node, priority, "", f"uid-{key}")


LEAF_LEVELS = Levels(("example.com/leaf",), ("leaf",), True)


def test_the_gang_s_topology_levels_go_to_every_plan_it_asks_for() -> None:
    planner = FakePlanner(free=1)  # only the minimum fits: the whole gang, then its minimum
    got = run(gang(member("m0"), member("m1"), member("m2"), levels=LEAF_LEVELS), planner)
    assert planner.called("plan_gang") == [("ns/m0", "ns/m1", "ns/m2"), ("ns/m0", "ns/m1")]
    assert planner.levels_seen == [LEAF_LEVELS, LEAF_LEVELS, LEAF_LEVELS]  # and the victim search
    assert got.state.wait_code == "InsufficientResources"


def test_a_topology_wish_that_does_not_decode_waits_with_its_own_reason() -> None:
    why = "topology: pod ns/m0: topoalloc.io/required-topology: is not a valid label key (got 'a b')"
    got = run(
        gang(member("m0"), member("m1"), problem=why, problem_code="InvalidTopology"), FakePlanner(free=8)
    )
    assert reports(got.actions) == [("GangWaiting", why)]
    assert got.state.wait_code == "InvalidTopology"
