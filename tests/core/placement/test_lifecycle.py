"""The placement lifecycle, step by step, with a door that answers as told."""

from __future__ import annotations

from dataclasses import dataclass, field

from allocator.core.actions import Count, Event, Evict, Forget, ObjectRef, Requeue, Retry, WriteStatus
from allocator.core.placement.lifecycle import (
    CONDITION,
    BindPlacement,
    ClearPlacement,
    NoRoom,
    Placed,
    PlacementLifecycle,
    PlacementLifecycleSettings,
    WritePlacement,
    queue_order,
)
from allocator.core.placement.view import Outcome, PendingPod, PlacementView
from apis import keys

GATE = keys.PLACEMENT_GATE


@dataclass
class Door:
    answers: dict[str, list[Placed | NoRoom]] = field(default_factory=dict)
    held_keys: set[str] = field(default_factory=set)
    restorable: set[str] = field(default_factory=set)
    asked: list[tuple[str, frozenset[str]]] = field(default_factory=list)
    released: list[str] = field(default_factory=list)

    def place(self, key: str, refused: frozenset[str]) -> Placed | NoRoom:
        self.asked.append((key, refused))
        got = self.answers[key].pop(0)
        if isinstance(got, Placed):
            self.held_keys.add(key)
        return got

    def restore(self, key: str) -> bool:
        if key in self.restorable:
            self.held_keys.add(key)
            return True
        return False

    def held(self, key: str) -> bool:
        return key in self.held_keys

    def release(self, key: str) -> None:
        self.released.append(key)
        self.held_keys.discard(key)


def pod(name: str, *, gates: tuple[str, ...] = (GATE,), priority: int = 0, created: str = "2026-11-29T00:00:00Z",
        placed_on: str = "", refused: str = "", since: str = "") -> PendingPod:  # fmt: skip
    return PendingPod(
        ObjectRef("ns", name, f"uid-{name}"), priority, created, gates, placed_on, refused, since
    )


ON_N1 = Placed("n1", {keys.DEVICE_ALLOCATED: '{"gpu":[{"minor":0}]}', keys.ALLOCATED_NODE: "n1"})


def test_a_gated_pod_is_placed_and_written_once() -> None:
    door = Door({"ns/a": [ON_N1]})
    life = PlacementLifecycle(door)
    actions = life.step(PlacementView([pod("a")]), 0.0)
    assert actions[0] == WritePlacement(ObjectRef("ns", "a", "uid-a"), "n1", ON_N1.annotations)
    assert Forget("ns/a") in actions and Count("placements", "placed") in actions
    # The watch still shows the gate: not placed twice.
    assert life.step(PlacementView([pod("a")]), 1.0) == []
    assert door.asked == [("ns/a", frozenset())]


def test_another_gate_is_waited_for() -> None:
    door = Door({"ns/a": [ON_N1]})
    assert (
        PlacementLifecycle(door).step(PlacementView([pod("a", gates=(keys.GANG_SCHEDULING_GATE, GATE))]), 0)
        == []
    )
    assert door.asked == []


def test_a_pod_that_fits_nowhere_says_why_once_and_retries() -> None:
    why = "0/3 nodes can host the pod's devices: 3 Insufficient nvidia.com/gpu"
    door = Door({"ns/a": [NoRoom(why), NoRoom(why)]})
    life = PlacementLifecycle(door)
    first = life.step(PlacementView([pod("a")]), 0)
    ref = ObjectRef("ns", "a", "uid-a")
    assert Event(ref, "Warning", "FailedPlacement", why, "Placing") in first
    (status,) = [a for a in first if isinstance(a, WriteStatus)]
    assert status.status["conditions"][0] == {
        "type": CONDITION,
        "status": "False",
        "reason": "Unplaceable",
        "message": why,
    }
    assert Retry("ns/a") in first
    second = life.step(PlacementView([pod("a")]), 1)
    assert second == [Retry("ns/a"), Count("placements", "unplaceable")]  # said once


def test_victims_are_evicted_once_and_the_pod_looked_at_again() -> None:
    victim = (ObjectRef("ns", "low", "uid-low"), "n2")
    door = Door({"ns/a": [NoRoom("no room", (victim,)), NoRoom("no room", (victim,))]})
    life = PlacementLifecycle(door, PlacementLifecycleSettings(preemption_recheck=2.0))
    first = life.step(PlacementView([pod("a", priority=100)]), 0)
    assert Evict(victim[0], "n2", owner="ns/a") in first and Requeue("ns/a", 2.0) in first
    assert any(isinstance(a, Event) and a.reason == "Preempting" for a in first)
    second = life.step(PlacementView([pod("a", priority=100)]), 1)
    assert second == [Requeue("ns/a", 2.0)]  # the eviction is not asked again
    life.victims_gone(["ns/low"])


def test_no_preemption_when_turned_off() -> None:
    victim = (ObjectRef("ns", "low", "uid-low"), "n2")
    door = Door({"ns/a": [NoRoom("no room", (victim,))]})
    actions = PlacementLifecycle(door, PlacementLifecycleSettings(preemption=False)).step(
        PlacementView([pod("a")]), 0
    )
    assert not any(isinstance(a, Evict) for a in actions) and Retry("ns/a") in actions


def test_refused_by_kube_scheduler_it_is_placed_anew_elsewhere_once_per_refusal() -> None:
    on_n2 = Placed("n2", {keys.ALLOCATED_NODE: "n2"})
    door = Door({"ns/a": [on_n2]}, held_keys={"ns/a"})
    life = PlacementLifecycle(door)
    refused = pod("a", gates=(), placed_on="n1", refused="0/3 nodes are available", since="t1")
    actions = life.step(PlacementView([refused]), 0)
    assert actions[0] == WritePlacement(refused.ref, "n2", on_n2.annotations, ungate=False)
    assert door.asked == [("ns/a", frozenset({"n1"}))] and door.released == ["ns/a"]
    assert life.step(PlacementView([refused]), 1) == []  # the same refusal: acted on once


def test_kube_schedulers_gang_plugin_waiting_for_the_group_is_no_refusal() -> None:
    """Kube-scheduler holds a placed member of its own pod group until the group is there: its node
    was not refused, so the placement stays (no re-placing, nothing cleared, no Event)."""
    door = Door(held_keys={"ns/a"})
    life = PlacementLifecycle(door)
    for since, why in (
        ("t1", "pod group is unschedulable, waiting for minCount pods from a gang to be scheduled, "
               "one or more plugins asked to wait and no plugin rejected pod"),
        ("t2", "waiting for minCount pods from a gang to appear in scheduling queue"),
        ("t3", "rejected due to timeout after waiting 5m0s at plugin GangScheduling"),
    ):  # fmt: skip
        waiting = pod("a", gates=(), placed_on="n1", refused=why, since=since)
        assert life.step(PlacementView([waiting]), 0) == []
    assert door.asked == [] and door.released == []
    # Its fit error later is a refusal: placed anew elsewhere.
    door.answers["ns/a"] = [Placed("n2", {keys.ALLOCATED_NODE: "n2"})]
    refused = pod("a", gates=(), placed_on="n1", refused="0/3 nodes are available: 1 port", since="t4")
    actions = life.step(PlacementView([refused]), 1)
    assert isinstance(actions[0], WritePlacement) and actions[0].node == "n2"
    assert door.asked == [("ns/a", frozenset({"n1"}))]


def test_no_node_left_clears_the_recorded_allocation() -> None:
    door = Door({"ns/a": [NoRoom("nothing")]}, held_keys={"ns/a"})
    refused = pod("a", gates=(), placed_on="n1", refused="0/3 nodes are available: 1 taint", since="t1")
    actions = PlacementLifecycle(door).step(PlacementView([refused]), 0)
    assert actions[0] == ClearPlacement(refused.ref)
    assert any(isinstance(a, Event) and a.reason == "PlacementCleared" for a in actions)


def test_a_placement_made_by_another_leader_is_held_again_or_made_anew() -> None:
    door = Door({"ns/b": [Placed("n3", {})]}, restorable={"ns/a"})
    life = PlacementLifecycle(door)
    actions = life.step(
        PlacementView([pod("a", gates=(), placed_on="n1"), pod("b", gates=(), placed_on="n1")]), 0
    )
    assert door.held("ns/a")  # held again as recorded: nothing to write
    assert [a for a in actions if isinstance(a, WritePlacement)] == [
        WritePlacement(ObjectRef("ns", "b", "uid-b"), "n3", {}, ungate=False)
    ]


def test_a_refused_write_releases_the_hold_and_retries() -> None:
    door = Door({"ns/a": [ON_N1, ON_N1]})
    life = PlacementLifecycle(door)
    life.step(PlacementView([pod("a")]), 0)
    actions = life.step(PlacementView([pod("a")], {"ns/a": Outcome(refused="409 Conflict")}), 1)
    assert door.released == ["ns/a"] and Retry("ns/a") in actions
    assert any(isinstance(a, Event) and "409 Conflict" in a.note for a in actions)
    # Tried again on its next look.
    assert isinstance(life.step(PlacementView([pod("a")]), 2)[0], WritePlacement)


def test_a_pod_whose_scheduler_does_not_run_is_placed_and_bound_here() -> None:
    door = Door({"ns/old": [ON_N1]})
    old = PendingPod(ObjectRef("ns", "old", "uid-old"), 0, "t", (), "", "", binds_here=True)
    actions = PlacementLifecycle(door).step(PlacementView([old]), 0)
    assert actions[0] == BindPlacement(old.ref, "n1", ON_N1.annotations)


def test_queue_order_is_priority_then_age() -> None:
    pods = [pod("old", created="1"), pod("high", priority=10, created="3"), pod("new", created="2")]
    assert [p.ref.name for p in queue_order(pods)] == ["high", "old", "new"]


def test_what_a_gone_pod_left_is_forgotten() -> None:
    door = Door({"ns/a": [ON_N1, ON_N1, ON_N1]})
    life = PlacementLifecycle(door)
    life.step(PlacementView([pod("a")]), 0)
    assert life.step(PlacementView([]), 1) == []  # a pass that did not look at it forgets nothing
    assert life.step(PlacementView([pod("a")]), 2) == []
    life.step(PlacementView([], full=True), 3)  # a pass that looked at everything shows no such pod
    assert isinstance(life.step(PlacementView([pod("a")]), 4)[0], WritePlacement)  # re-created
    life.forget(["ns/a"])  # or the caller says it left
    assert isinstance(life.step(PlacementView([pod("a")]), 5)[0], WritePlacement)
