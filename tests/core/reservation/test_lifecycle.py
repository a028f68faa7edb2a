"""The Reservation lifecycle's pure step (core/reservation/lifecycle.py) against a door that
records what it was asked: each phase's decision, the writes in order, deadlines, preemption, gangs
whole, and freed room offered to the pods kube-scheduler holds back."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from allocator.core.actions import Annotate, Evict, Nudge, ObjectRef, Requeue, WriteStatus
from allocator.core.gang.victims import Candidate
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from allocator.core.reservation.door import GangTopology, Placing, Spot
from allocator.core.reservation.lifecycle import Action, LifecycleSettings, WriteInOrder, step
from allocator.core.reservation.status import OwnerPod
from allocator.core.reservation.view import GangSeen, HeldRoom, PassView, Seen, Victim, WaitingPod
from apis import keys
from apis import reservation as rv
from apis.annotations import DeviceAllocation, DeviceAllocations
from tests.core.pods import gpus, pod

NOW = 1_000_000.0
SETTINGS = LifecycleSettings(preemption_timeout=300.0)
TWO = DeviceAllocations({"gpu": [DeviceAllocation(0), DeviceAllocation(1)]})


@dataclass
class Door:
    """The cluster as the step sees it: what it placed, held and released."""

    placing: Placing = field(default_factory=Placing)
    preempting: Placing = field(default_factory=Placing)
    nodes: list[str] = field(default_factory=lambda: ["n1", "n2"])
    queue: list[WaitingPod] = field(default_factory=list)
    fitting: Mapping[str, str] = field(default_factory=dict)  # pod key -> the node it fits
    held: list[tuple[Spot, tuple[str, ...]]] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    rooms: dict[str, str] = field(default_factory=dict)  # name -> node held
    gone: list[str] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)
    gangs: list[tuple[tuple[str, ...], GangTopology]] = field(default_factory=list)

    def admitting_nodes(self, seen: Seen) -> list[str]:
        return list(self.nodes)

    def place_one(self, name: str, req: PodRequest, names: Sequence[str]) -> Placing:
        return self.placing

    def place_gang(
        self, members: Sequence[str], reqs: Sequence[PodRequest], names: Sequence[str], topology: GangTopology
    ) -> Placing:
        self.gangs.append((tuple(members), topology))
        return self.placing

    def with_preemption(
        self, members: Sequence[str], reqs: Sequence[PodRequest], names: Sequence[str], topology: GangTopology
    ) -> Placing:
        return self.preempting

    def hold_room(self, spot: Spot, victims: tuple[str, ...], annotations: Mapping[str, str]) -> None:
        self.held.append((spot, victims))

    def victims_gone(self, name: str) -> None:
        self.gone.append(name)

    def release_room(self, name: str) -> str:
        self.released.append(name)
        return self.rooms.get(name, "")

    def waiting(self, limit: int) -> Sequence[WaitingPod]:
        return self.queue[:limit]

    def fits(self, pod: str, nodes: Collection[str]) -> str:
        self.asked.append(pod)
        node = self.fitting.get(pod, "")
        return node if node in nodes else ""


def res(name: str = "r", **kw: Any) -> rv.Reservation:
    spec = kw.pop("spec", {})
    template = {"metadata": {"namespace": "default"}, "spec": spec}
    return rv.Reservation(
        name=name, uid=f"uid-{name}", created=kw.pop("created", NOW - 60), template=template, **kw
    )


def seen(r: rv.Reservation | None = None, **kw: Any) -> Seen:
    r = r if r is not None else res()
    req = pod_request(pod(gpus(2), name=f"reservation-{r.name}"))
    return Seen(r.name, r.uid, r, req=req, **kw)


def run(*reservations: Seen, door: Door | None = None, **view: Any) -> tuple[list[Action], Door]:
    door = door if door is not None else Door()
    return step(PassView(tuple(reservations), **view), NOW, door, SETTINGS), door


def writes(actions: list[Action]) -> list[WriteInOrder]:
    return [a for a in actions if isinstance(a, WriteInOrder)]


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def waiting(name: str, priority: int = 0, created: float = 0.0) -> WaitingPod:
    return WaitingPod(ObjectRef("ns", name, f"uid-{name}"), priority, created)


def test_an_invalid_one_is_told_once_and_never_placed() -> None:
    bad = Seen("bad", "uid-bad", None, error="spec.ttl: is not a duration", status={"phase": "Pending"})
    actions, door = run(bad)
    [w] = writes(actions)
    [status] = w.writes
    assert isinstance(status, WriteStatus) and condition(status.status, "Scheduled")["reason"] == "Invalid"
    assert w.event is not None and (w.event.type, w.event.reason) == ("Warning", "InvalidReservation")
    assert w.said == "spec.ttl: is not a duration" and not door.held
    again, _ = run(Seen("bad", "uid-bad", None, error="spec.ttl: is not a duration", said=w.said))
    assert again == []


def test_an_expired_one_gives_its_room_back_and_the_waiting_pods_that_fit_it_are_nudged() -> None:
    r = res(ttl=30)  # created a minute ago
    room = HeldRoom("n1", TWO)
    door = Door(rooms={"r": "n1"}, queue=[waiting("fits"), waiting("too-big")], fitting={"ns/fits": "n1"})
    actions, _ = run(seen(replace(r, phase=rv.AVAILABLE), room=room), door=door)
    assert door.released == ["r"]
    [w] = writes(actions)
    [status] = w.writes
    assert isinstance(status, WriteStatus) and status.status["phase"] == rv.FAILED
    assert condition(status.status, "Ready")["reason"] == "Expired"
    assert w.event is not None and w.event.reason == "ReservationExpired"
    assert [a for a in actions if isinstance(a, Nudge)] == [Nudge(ObjectRef("ns", "fits", "uid-fits"), "n1")]


def test_a_live_one_is_looked_at_again_when_it_expires() -> None:
    actions, _ = run(seen(res(ttl=3600), room=HeldRoom("n1", TWO)))
    assert Requeue("r", 3540.0) in actions


def test_room_freed_since_the_last_pass_is_offered_in_queue_order_and_bounded() -> None:
    queue = [waiting(f"p{i}", priority=i % 3, created=float(i)) for i in range(40)]
    queue.sort(key=lambda p: p.order)
    door = Door(queue=queue, fitting={p.ref.key: "n2" for p in queue})
    actions, _ = run(door=door, freed=frozenset({"n2"}))
    nudged = [a.pod.name for a in actions if isinstance(a, Nudge)]
    assert nudged == [p.ref.name for p in queue[: SETTINGS.nudges]]
    assert nudged[0] == "p2"  # the highest priority, oldest first


def test_only_the_first_pods_of_the_queue_are_weighed() -> None:
    queue = [waiting(f"p{i}", created=float(i)) for i in range(SETTINGS.looked_at + 10)]
    door = Door(queue=queue, fitting={"ns/p" + str(SETTINGS.looked_at + 5): "n1"})
    actions, _ = run(door=door, freed=frozenset({"n1"}))
    assert not [a for a in actions if isinstance(a, Nudge)] and len(door.asked) == SETTINGS.looked_at


def test_nothing_freed_asks_nothing() -> None:
    door = Door(queue=[waiting("p")], fitting={"ns/p": "n1"})
    actions, _ = run(door=door)
    assert actions == [] and door.asked == []


def test_allocate_once_with_an_owner_bound_succeeds_and_gives_the_rest_back() -> None:
    r = res(phase=rv.AVAILABLE)
    owner = OwnerPod("ns/o", "uid-o", 1000, 2**30)
    door = Door(rooms={"r": "n1"}, queue=[waiting("next")], fitting={"ns/next": "n1"})
    actions, _ = run(seen(r, room=HeldRoom("n1", TWO), bound=("ns/o",), owners=(owner,)), door=door)
    [w] = writes(actions)
    [status] = w.writes
    assert isinstance(status, WriteStatus) and status.status["phase"] == rv.SUCCEEDED
    assert status.status["currentOwners"] == [{"namespace": "ns", "name": "o", "uid": "uid-o"}]
    assert w.event is not None and w.event.note == "allocated to ns/o (allocateOnce)"
    assert door.released == ["r"] and any(isinstance(a, Nudge) for a in actions)


def test_a_shared_room_follows_its_owners_and_says_nothing_new_twice() -> None:
    r = res(phase=rv.AVAILABLE, allocate_once=False)
    owner = OwnerPod("ns/o", "uid-o")
    actions, _ = run(seen(r, room=HeldRoom("n1", TWO), bound=("ns/o",), owners=(owner,)))
    [w] = writes(actions)
    [status] = w.writes
    assert isinstance(status, WriteStatus) and status.status["allocated"] == {"pods": "1"}
    assert w.event is None and w.said is None
    recorded = {
        "currentOwners": [{"namespace": "ns", "name": "o", "uid": "uid-o"}],
        "allocated": {"pods": "1"},
    }
    again, _ = run(seen(r, room=HeldRoom("n1", TWO), bound=("ns/o",), owners=(owner,), status=recorded))
    assert writes(again) == []


def test_a_room_whose_node_is_gone_fails() -> None:
    actions, door = run(seen(res(phase=rv.AVAILABLE), room=HeldRoom("n9", TWO), node_exists=False))
    [w] = writes(actions)
    assert w.event is not None and (w.event.type, w.event.reason) == ("Warning", "ReservationFailed")
    assert door.released == ["r"]


def test_a_pending_one_is_held_then_written_devices_first() -> None:
    door = Door(placing=Placing((Spot("r", "n1", TWO),)))
    actions, _ = run(seen(), door=door)
    assert [spot.node for spot, _ in door.held] == ["n1"]
    [w] = writes(actions)
    annotate, status = w.writes
    assert isinstance(annotate, Annotate) and annotate.annotations[keys.DEVICE_ALLOCATED] == TWO.to_json()
    assert isinstance(status, WriteStatus) and status.status["phase"] == rv.AVAILABLE
    assert status.status["nodeName"] == "n1" and w.said == ""
    assert w.event is not None and w.event.reason == "Reserved"


def test_one_that_fits_nowhere_waits_saying_why() -> None:
    door = Door(placing=Placing(message="0/2 nodes can hold it"))
    actions, _ = run(seen(), door=door)
    [w] = writes(actions)
    [status] = w.writes
    assert isinstance(status, WriteStatus)
    assert condition(status.status, "Scheduled")["message"] == "0/2 nodes can hold it"
    assert w.event is not None and w.event.reason == "FailedReserve" and not door.held


def test_with_a_priority_it_preempts_and_its_room_waits_for_the_victims() -> None:
    victim = Candidate("ns/low", "n1", 0, "", "uid-low")
    door = Door(preempting=Placing((Spot("r", "n1", TWO),), (victim,)))
    actions, _ = run(seen(res(spec={"priority": 100})), door=door)
    assert door.held == [(Spot("r", "n1", TWO), ("ns/low",))]
    assert Evict(ObjectRef("ns", "low", "uid-low"), "n1", "r") in actions
    assert Requeue("r", SETTINGS.preemption_timeout) in actions
    [w] = writes(actions)
    assert w.event is not None and w.event.reason == "Preempting"
    # Without a priority it only waits.
    door = Door(preempting=Placing((Spot("r", "n1", TWO),), (victim,)))
    actions, _ = run(seen(), door=door)
    assert not door.held and not any(isinstance(a, Evict) for a in actions)


def test_a_room_placed_here_is_written_once_its_victims_are_gone_or_given_up() -> None:
    left = Victim("ns/low", "uid-low", "n1")
    leaving = Victim("ns/going", "uid-going", "n1", deleting=True)
    room = HeldRoom("n1", TWO, placed_here=True, victims=("ns/low", "ns/going"), left=(left, leaving))
    actions, door = run(seen(room=replace(room, held_since=NOW - 10)))
    assert [a for a in actions if isinstance(a, Evict)] == [
        Evict(ObjectRef("ns", "low", "uid-low"), "n1", "r")
    ]
    assert Requeue("r", 290.0) in actions and not writes(actions)
    late = replace(room, held_since=NOW - 400)
    door = Door(rooms={"r": "n1"})
    actions, _ = run(seen(room=late), door=door)
    assert door.released == ["r"] and Requeue("r") in actions and not writes(actions)
    gone = replace(room, left=())
    actions, door = run(seen(room=gone))
    assert door.gone == ["r"] and writes(actions)[0].event.reason == "Reserved"  # type: ignore[union-attr]


def test_a_gang_is_placed_whole_or_waits_for_its_members() -> None:
    gang = {
        "labels": {"topoalloc.io/reservation-gang": "g"},
        "annotations": {"topoalloc.io/reservation-gang-size": "3"},
    }
    members = [seen(res(f"g-{i}", **gang)) for i in range(2)]
    door = Door(placing=Placing((Spot("g-0", "n1", TWO), Spot("g-1", "n1", TWO))))
    actions, _ = run(*members, door=door, gangs={"g": GangSeen()})
    assert not door.held and {w.event.reason for w in writes(actions)} == {"GangWaiting"}  # type: ignore[union-attr]
    actions, _ = run(*members, door=door, gangs={"g": GangSeen({"n2": 1})})  # the third holds room
    assert door.gangs[-1][0] == ("g-0", "g-1") and len(door.held) == 2


def test_another_schedulers_reservation_is_left_alone() -> None:
    settings = LifecycleSettings(scheduler_names=("topoalloc",))
    door = Door(placing=Placing((Spot("r", "n1", TWO),)))
    actions = step(PassView((seen(),)), NOW, door, settings)
    assert not door.held and not writes(actions)
