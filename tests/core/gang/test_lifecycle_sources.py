"""The gang lifecycle step for gangs defined by Kubernetes' own objects: a 1.36 PodGroup (status kept
as topoalloc's own conditions, no start time in it) and a 1.35 Workload's pod group (no status at all:
Events on the Workload, the decisions remembered in the lifecycle's state)."""

from __future__ import annotations

from allocator.core.actions import Event, ObjectRef, WriteStatus
from allocator.core.gang.actions import TellMembers
from apis import podgroup as pg
from apis.gang_object import native_conditions
from tests.core.gang.world import NOW, FakePlanner, gang, kinds, later, member, run

WORKLOAD = ObjectRef("ns", "g", kind="Workload", api_version="scheduling.k8s.io/v1alpha1")
NATIVE = ObjectRef("ns", "g", kind="PodGroup", api_version="scheduling.k8s.io/v1alpha2")
FAILED = "no placement for the whole gang within its 10s timeout: no placement found"


def test_a_workload_gang_reports_on_the_workload_and_writes_no_status() -> None:
    got = run(gang(member("m0"), source=pg.WORKLOAD_SOURCE), FakePlanner(free=8))
    assert kinds(got.actions) == ["Event", "TellMembers"]
    assert got.actions[0] == Event(
        WORKLOAD, "Warning", "GangWaiting", "waiting for members: the gang needs at least 2"
    )


def test_a_workload_gang_times_out_once_counting_from_its_members() -> None:
    # The members were created an hour ago; a Workload keeps no start time: its members' say when.
    planner = FakePlanner(free=0)
    view = gang(member("m0"), member("m1"), timeout=10, source=pg.WORKLOAD_SOURCE)
    got = run(view, planner)
    assert kinds(got.actions) == ["Count", "Event", "TellMembers"]
    assert got.actions[1] == Event(WORKLOAD, "Warning", "GangFailed", FAILED)
    again = run(view, planner, got.state, later(NOW, 5))
    assert planner.calls == [] and again.actions == [TellMembers(view, again.state)]


def test_a_native_podgroup_keeps_topoalloc_conditions_and_stays_failed_after_a_restart() -> None:
    planner = FakePlanner(free=0)
    view = gang(member("m0"), member("m1"), timeout=10, source=pg.NATIVE_SOURCE)
    got = run(view, planner)
    (write,) = [a for a in got.actions if isinstance(a, WriteStatus)]
    assert write.target == NATIVE
    assert got.actions[1] == Event(NATIVE, "Warning", "GangFailed", FAILED)
    assert [c["type"] for c in native_conditions(write.status)] == [
        "topoalloc.io/Scheduled", "topoalloc.io/Waiting", "topoalloc.io/Preempting", "topoalloc.io/TimedOut",
    ]  # fmt: skip
    # A new leader reads topoalloc's conditions back from the PodGroup (world.gang writes them as
    # the PodGroup's): failed, not planned again.
    restarted = gang(member("m0"), member("m1"), timeout=10, source=pg.NATIVE_SOURCE, status=write.status)
    assert restarted.api_object is not None and restarted.api_object.status.phase == "Failed"
    again = run(restarted, planner, None, later(NOW, 5))
    assert planner.calls == [] and "GangFailed" not in [
        r.reason for r in again.actions if isinstance(r, Event)
    ]


def test_a_native_gang_is_planned_and_ungated_like_any() -> None:
    planner = FakePlanner(free=4)
    got = run(gang(member("m0"), member("m1", gated=False), source=pg.NATIVE_SOURCE), planner)
    assert kinds(got.actions) == [
        "Count",
        "Event",
        "Requeue",
        "Ungate",
        "Nudge",
        "TellMembers",
        "WriteStatus",
    ]
    assert got.actions[1] == Event(
        NATIVE, "Normal", "GangPlanned", "planned 2 member(s) on n1; releasing them"
    )
