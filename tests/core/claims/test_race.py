"""A device in two claims (allocator/core/claims/race.py): which claim moves, which pod leaves; a
bound pod whose claim topoalloc moved to another node."""

from __future__ import annotations

from dataclasses import replace

from allocator.core.actions import Count, Event, Evict, ObjectRef
from allocator.core.claims.race import ClearClaim, Holder, HolderPod, MoveClaim, misplaced, repair
from apis import dra
from apis.dra_claims import Allocation, Consumer, DeviceResult, ResourceClaim
from apis.quantity import Quantity

OURS = ((dra.ALLOCATED_BY_ANNOTATION, dra.ALLOCATED_BY),)


def holder(name: str, since: int, *, ours: bool, reserved: bool, bound: bool, gated: bool = False,
           controller: str = "ReplicaSet/rs") -> Holder:  # fmt: skip
    claim = ResourceClaim(
        "ns",
        name,
        uid=f"u-{name}",
        resource_version=str(since),
        annotations=OURS if ours else (),
        allocation=Allocation((DeviceResult("gpus", dra.DRIVER, "n1", "gpu-0"),), "n1"),
        reserved_for=(Consumer("pods", f"{name}-pod", f"u-{name}-pod"),) if reserved else (),
    )
    pod = HolderPod(
        f"ns/{name}-pod", ObjectRef("ns", f"{name}-pod", f"u-{name}-pod"), bound, gated, controller
    )
    return Holder(claim, since, (pod,))


def test_a_claim_still_gated_by_topoalloc_is_left_to_the_lifecycle() -> None:
    ours = holder("a", 20, ours=True, reserved=False, bound=False, gated=True)
    theirs = holder("b", 10, ours=False, reserved=True, bound=True)
    assert repair("n1/gpu-0", [ours, theirs]) == []


def test_the_claim_that_can_still_move_moves_whatever_its_age() -> None:
    ours = holder("a", 10, ours=True, reserved=False, bound=False)  # first, but not reserved yet
    theirs = holder("b", 20, ours=False, reserved=True, bound=True)
    actions = repair("n1/gpu-0", [theirs, ours])
    assert [type(a).__name__ for a in actions] == ["MoveClaim", "Count", "Event"]
    assert isinstance(actions[0], MoveClaim) and actions[0].claim.key == "ns/a"
    assert actions[1] == Count("double_booked", "moved")
    assert isinstance(actions[2], Event) and "ns/b (allocated first)" in actions[2].note
    unreserved = holder("b", 20, ours=False, reserved=False, bound=False)
    fixed = holder("a", 10, ours=True, reserved=True, bound=True)
    actions = repair("n1/gpu-0", [fixed, unreserved])
    assert isinstance(actions[0], ClearClaim) and actions[0].claim.key == "ns/b"


def test_when_none_can_move_the_later_claims_bound_pod_is_evicted_or_said_stuck() -> None:
    first = holder("a", 10, ours=True, reserved=True, bound=True)
    later = holder("b", 20, ours=False, reserved=True, bound=True)
    actions = repair("n1/gpu-0", [later, first])
    assert isinstance(actions[0], Evict) and actions[0].pod.name == "b-pod"
    note = actions[2].note if isinstance(actions[2], Event) else ""
    assert note.startswith("device n1/gpu-0 is in claim ns/b and in claim ns/a (allocated first)")
    bare = holder("b", 20, ours=False, reserved=True, bound=True, controller="")
    actions = repair("n1/gpu-0", [bare, first])
    assert actions[0] == Count("double_booked", "stuck") and isinstance(actions[1], Event)
    assert repair("n1/gpu-0", [later, first], done={"ns/b"}) == []
    binding = holder("b", 20, ours=False, reserved=True, bound=False)  # reserved, being bound
    assert repair("n1/gpu-0", [binding, first]) == []


def share_holder(name: str, since: int, cores: int, *, bound: bool) -> Holder:
    h = holder(name, since, ours=False, reserved=bound, bound=bound)
    result = DeviceResult(
        "gpus", dra.DRIVER, "n1", "gpu-0", share_id=f"s-{name}", consumed=(("cores", Quantity.of(cores)),)
    )
    return Holder(replace(h.claim, allocation=Allocation((result,), "n1")), since, h.pods)


def test_shares_that_fit_keep_the_device_and_only_the_overflow_moves() -> None:
    capacity = {"cores": 100}
    a = share_holder("a", 10, 50, bound=True)
    b = share_holder("b", 20, 40, bound=True)
    c = share_holder("c", 30, 30, bound=False)  # 120 with a and b: c moves, a and b stay
    actions = repair("n1/gpu-0", [c, b, a], capacity=capacity)
    assert [type(x).__name__ for x in actions] == ["ClearClaim", "Count", "Event"]
    assert isinstance(actions[0], ClearClaim) and actions[0].claim.key == "ns/c"
    # one that cannot move is kept before a movable one that came first: the movable one goes
    early = share_holder("e", 5, 60, bound=False)
    actions = repair("n1/gpu-0", [early, a, b], capacity=capacity)
    assert isinstance(actions[0], ClearClaim) and actions[0].claim.key == "ns/e"
    # without the device's capacity, shares are not risked: only the first keeps it
    actions = repair("n1/gpu-0", [a, b])
    assert isinstance(actions[0], Evict) and actions[0].pod.name == "b-pod"
    assert isinstance(repair("n1/gpu-0", [a, c])[0], ClearClaim)
    whole = holder("w", 40, ours=False, reserved=False, bound=False)
    actions = repair("n1/gpu-0", [a, whole], capacity=capacity)
    assert isinstance(actions[0], ClearClaim) and actions[0].claim.key == "ns/w"


def test_a_bound_pod_whose_claim_is_on_another_node_is_evicted_or_said_stuck() -> None:
    h = holder("a", 10, ours=True, reserved=True, bound=True)  # the claim selects n1
    (pod,) = h.pods
    actions = misplaced(h.claim, pod, "n2")
    assert actions[:2] == [Evict(pod.ref, "n2", owner="ns/a-pod"), Count("double_booked", "evicted")]
    event = actions[2]
    assert isinstance(event, Event) and event.reason == "DRAClaimOnAnotherNode" and event.type == "Warning"
    assert event.note.startswith("claim ns/a is allocated on node n1 but the pod was bound to node n2")
    assert "ReplicaSet/rs" in event.note
    bare = replace(pod, controller="")
    actions = misplaced(h.claim, bare, "n2")
    assert actions[0] == Count("double_booked", "stuck") and len(actions) == 2
    assert isinstance(actions[1], Event) and "no controller" in actions[1].note and "n1" in actions[1].note


def test_a_pod_on_its_claims_node_or_a_claim_not_ours_or_not_its_own_is_left_alone() -> None:
    h = holder("a", 10, ours=True, reserved=True, bound=True)
    (pod,) = h.pods
    assert misplaced(h.claim, pod, "n1") == []  # the claim's node
    theirs = holder("a", 10, ours=False, reserved=True, bound=True)
    assert misplaced(theirs.claim, pod, "n2") == []  # kube-scheduler's allocation: not ours to judge
    unreserved = holder("a", 10, ours=True, reserved=False, bound=True)
    assert misplaced(unreserved.claim, pod, "n2") == []  # reserved for no pod (or another one)
    assert misplaced(h.claim, replace(pod, bound=False), "") == []  # not bound
