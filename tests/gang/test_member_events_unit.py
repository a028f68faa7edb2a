"""MemberEvents (allocator/gang/member_events.py) with a recording stand-in for the Event recorder
and a hand-driven clock: once per kind of decision, its own rate limit, bound members skipped."""

from __future__ import annotations

from typing import Any

from allocator.core.gang.gang_state import Decision, GangState
from allocator.core.gang.view import Gang, MemberPod
from allocator.gang.member_events import MemberEvents


class Recorded:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def record(self, ref: Any, type_: str, reason: str, action: str, note: str) -> None:
        self.events.append((ref.name, reason, note))


def pod(name: str, node: str = "") -> MemberPod:
    return MemberPod(
        f"ns/{name}", "ns", name, f"uid-{name}", None, "", "", node, "Pending", False, "", (), "", {}
    )


def gang(*members: MemberPod) -> Gang:
    return Gang("ns/g", "ns", "g", "podgroup", None, "", len(members), 0.0, list(members))


def setup(burst: int = 20) -> tuple[MemberEvents, Recorded, list[float]]:
    now = [0.0]
    rec = Recorded()
    return MemberEvents(rec, lambda: now[0], rate=2.0, burst=burst), rec, now  # type: ignore[arg-type]


def test_same_kind_of_wait_is_told_once_and_a_new_kind_again() -> None:
    tell, rec, _ = setup()
    g, state = gang(pod("a"), pod("b", node="n1")), GangState()
    state.decision = Decision("GangWaiting", "InsufficientTopology", "Warning", "no placement: 2 of 4 fit")
    assert tell.tell(g, state) == 1  # b is bound: not waiting
    state.decision = Decision("GangWaiting", "InsufficientTopology", "Warning", "no placement: 3 of 4 fit")
    assert tell.tell(g, state) == 0
    assert rec.events == [
        ("a", "GangWaiting", "gang ns/g waits (InsufficientTopology): no placement: 2 of 4 fit")
    ]
    # A starvation hold's wait is the same news as its GangHoldingRoom Event.
    state.decision = Decision("GangHoldingRoom", "", "Normal", "holding n1")
    assert tell.tell(g, state) == 1
    state.decision = Decision("GangWaiting", "HoldingRoom", "Warning", "holding n1 until 2 pods finish")
    assert tell.tell(g, state) == 0
    state.decision = Decision("GangScheduled", "", "Normal", "2 of 2 members are bound")
    assert tell.tell(g, state) == 2  # everyone hears it
    assert rec.events[-1] == ("b", "GangScheduled", "gang ns/g: 2 of 2 members are bound")


def test_a_big_gang_is_told_within_the_rate_limit_over_passes() -> None:
    tell, rec, now = setup(burst=5)
    g, state = gang(*(pod(f"m{i}") for i in range(12))), GangState()
    state.decision = Decision("GangFailed", "", "Warning", "timed out")
    assert tell.tell(g, state) == 5
    assert tell.tell(g, state) == 0  # no tokens left at the same instant
    now[0] = 1.0  # 2 tokens a second
    assert tell.tell(g, state) == 2
    now[0] = 100.0
    assert tell.tell(g, state) == 5
    assert sorted(name for name, _, _ in rec.events) == sorted(f"m{i}" for i in range(12))
    # A re-created member (new uid) is told again.
    now[0] = 200.0
    g.members[0] = MemberPod(
        "ns/m0", "ns", "m0", "uid-new", None, "", "", "", "Pending", False, "", (), "", {}
    )
    assert tell.tell(g, state) == 1
