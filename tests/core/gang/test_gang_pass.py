"""One pass over every gang (allocator/core/gang/gang_pass.py): queue order, the starvation head
for the first gang that waits, gangs without members forgotten, and the pass's gauges."""

from __future__ import annotations

from allocator.core.actions import Observe
from allocator.core.gang.actions import HELD_DEVICES, WAITING_GANGS, WAITING_PODS, ReleaseHolds
from allocator.core.gang.gang_pass import GangPass
from allocator.core.gang.gang_state import GangState, Planned, Preempting
from allocator.core.gang.lifecycle import release_all
from allocator.core.gang.making_room import LOWEST
from allocator.core.gang.victims import Candidate
from apis.timestamps import format_time
from tests.core.gang.world import NOW, FakePlanner, Rules, gang, member


def started(seconds_ago: float) -> dict[str, str]:
    return {"scheduleStartTime": format_time(NOW.wall - seconds_ago)}


def test_gangs_are_served_by_priority_then_by_how_long_they_waited() -> None:
    old = gang(member("o0", group="old"), min_member=1, name="old", status=started(900))
    new = gang(member("n0", group="new"), min_member=1, name="new", status=started(10))
    urgent = gang(member("u0", group="urgent", priority=5), min_member=1, name="urgent", status=started(1))
    unseen = gang(member("x0", group="unseen"), min_member=1, name="unseen", status=started(5_000))
    states = {g.key: GangState() for g in (old, new, urgent)}  # "unseen" has no state yet
    run = GangPass([unseen, new, old, urgent], states, NOW, Rules())
    assert [g.key for g in run.order] == ["ns/urgent", "ns/old", "ns/new", "ns/unseen"]


def test_only_the_first_gang_waiting_for_a_placement_gets_the_starvation_hold() -> None:
    # Both waited past the bound; nothing of a lower priority runs. Only the first in queue order
    # (the older one) holds the room freeing up; a gang still short of members never takes the head.
    running = [Candidate("ns/v1", "n1", 0, "", "uid-v1")]
    planner = FakePlanner(free=0, victims={"ns/v1"}, running_pods=running, present={"ns/v1"})
    short = gang(member("s0", group="short"), min_member=2, name="short", status=started(5_000))
    first = gang(member("a0", group="a"), min_member=1, name="a", status=started(2_000))
    second = gang(member("b0", group="b"), min_member=1, name="b", status=started(1_000))
    states = {g.key: GangState() for g in (short, first, second)}
    run = GangPass([second, first, short], states, NOW, Rules(starvation_bound=600))
    for g in run.order:
        run.step(g, NOW, planner)
    asked = [args[0][1] for args in planner.called("plan_with_preemption")]
    assert asked == [0, LOWEST, 0]  # a: preemption, then the hold; b: preemption only
    assert run.states["ns/a"].wait_code == "HoldingRoom"
    assert run.states["ns/b"].wait_code == "InsufficientResources"
    assert run.finish() == [
        Observe(WAITING_PODS, 2),  # a's member holds room (planned), b's and the short gang's wait
        Observe(HELD_DEVICES, 1),
        Observe(WAITING_GANGS, 1, "HoldingRoom"),  # one waiting gang per reason
        Observe(WAITING_GANGS, 1, "InsufficientResources"),
        Observe(WAITING_GANGS, 1, "WaitingForMembers"),
    ]


def test_a_gang_whose_members_are_all_gone_is_forgotten_and_its_holds_released() -> None:
    planner = FakePlanner(free=4)
    gone = gang(name="gone", min_member=1)
    state = GangState(plan={"ns/x": Planned("uid-x", "n1", 2)}, done=False)
    run = GangPass([gone], {"ns/gone": state}, NOW, Rules())
    run.step(gone, NOW, planner)
    assert run.states == {}
    assert planner.released[-1] == ReleaseHolds(("ns/x",))
    assert run.finish() == [Observe(WAITING_PODS, 0), Observe(HELD_DEVICES, 0)]


def test_losing_leadership_releases_every_plan_by_force() -> None:
    held = GangState(plan={"ns/a": Planned("uid-a", "n1"), "ns/b": Planned("uid-b", "n2")})
    preempting = GangState(plan={"ns/c": Planned("uid-c", "n3")}, preempting=Preempting({}, 0.0, evict=False))
    assert release_all([held, GangState(), preempting]) == ReleaseHolds(("ns/a", "ns/b", "ns/c"), force=True)
