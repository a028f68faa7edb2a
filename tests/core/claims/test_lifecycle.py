"""The claims lifecycle step (allocator/core/claims/lifecycle.py) without any I/O: pending pods and
their claims in, actions out, with a fake planner that hands out the GPUs of two nodes and holds
what it hands out at once (as the hold ledger does)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from allocator.core.actions import Event, Retry
from allocator.core.claims.lifecycle import (
    Action,
    ClaimsLifecycle,
    ClaimsLifecycleSettings,
    MoveClaims,
    ReleaseClaim,
    WriteAllocation,
)
from allocator.core.claims.solve import ClaimAnswer
from allocator.core.claims.view import ClaimsView, Member, Outcome, PendingPod, PodClaims
from apis import dra
from apis.dra_claims import Allocation, Consumer, DeviceResult, ResourceClaim

SETTINGS = ClaimsLifecycleSettings(reallocate_after=20.0, release_after=30.0)
OURS = ((dra.ALLOCATED_BY_ANNOTATION, dra.ALLOCATED_BY),)


@dataclass
class FakePlanner:
    """Each claim takes one GPU; a node's GPUs go to the first who asks (held at once)."""

    free: dict[str, list[str]] = field(default_factory=lambda: {"n1": ["gpu-0", "gpu-1"], "n2": ["gpu-0"]})
    calls: list[tuple[list[str], frozenset[str]]] = field(default_factory=list)

    def place(
        self, members: Sequence[Member], refused: frozenset[str] = frozenset()
    ) -> list[ClaimAnswer] | str:
        self.calls.append(([m.key for m in members], refused))
        answers = []
        for m in members:
            nodes = [m.pinned] if m.pinned else sorted(self.free)
            node = next((n for n in nodes if n not in refused and len(self.free[n]) >= len(m.todo)), None)
            if node is None:
                return "0/2 nodes can take the claims"
            results = {
                c.key: (DeviceResult("gpus", dra.DRIVER, node, self.free[node].pop(0)),) for c in m.todo
            }
            answers.append(ClaimAnswer(node, node, results, {}))
        return answers


def claim(
    name: str, *, node: str = "", ours: bool = True, reserved: bool = False, owner: str = ""
) -> ResourceClaim:
    allocation = Allocation((DeviceResult("gpus", dra.DRIVER, node, "gpu-0"),), node) if node else None
    return ResourceClaim(
        "default",
        name,
        uid=f"uid-{name}",
        resource_version="7",
        annotations=OURS if ours and node else (),
        allocation=allocation,
        reserved_for=(Consumer("pods", "x", "uid-x"),) if reserved else (),
        owner_pod=owner,
    )


def pod(
    name: str,
    *claims: ResourceClaim,
    gated: bool = True,
    unschedulable: str | None = None,
    gang: str = "",
    size: int = 0,
    outcome: Outcome | None = None,
    **sorted_claims: object,
) -> PendingPod:
    found = PodClaims(todo=[c for c in claims if c.allocation is None])
    found.allocated = [c for c in claims if c.allocation is not None]
    found.pinned = next((c.allocation.node for c in found.allocated if c.allocation), "")
    for k, v in sorted_claims.items():
        setattr(found, k, v)
    obj = {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"}}
    return PendingPod(f"default/{name}", f"uid-{name}", obj, gated, unschedulable, found, gang, size, outcome)


def kinds(actions: list[Action]) -> list[str]:
    return [f"{type(a).__name__}:{a.reason}" if isinstance(a, Event) else type(a).__name__ for a in actions]


def step(life: ClaimsLifecycle, *pods: PendingPod, now: float = 100.0, **view: object) -> list[Action]:
    return life.step(ClaimsView(sorted(pods, key=lambda p: p.key), **view), now)  # type: ignore[arg-type]


def make() -> tuple[ClaimsLifecycle, FakePlanner]:
    planner = FakePlanner()
    return ClaimsLifecycle(planner, SETTINGS), planner


# -- gated pods -----------------------------------------------------------------------------------


def test_a_gated_pod_is_placed_then_written_and_ungated_once_the_cache_shows_the_write() -> None:
    life, planner = make()
    actions = step(life, pod("p", claim("p-g")))
    assert kinds(actions) == ["Forget", "WriteAllocation"]
    write = actions[1]
    assert isinstance(write, WriteAllocation) and not write.ungate
    (placed,) = write.pods
    assert placed.member.key == "default/p" and [c.key for c in placed.member.todo] == ["default/p-g"]
    assert placed.answer is not None and placed.answer.node == "n1"
    # No Event for a plain allocation: the claim's status shows its devices (a write per pod saved).
    assert placed.written is None and placed.ungated is None
    assert planner.calls == [(["default/p"], frozenset())]
    # The write answered version 9: until the cache shows the claim at 9 or later, the gate stays.
    assert step(life, pod("p", claim("p-g"), outcome=Outcome(written=(("default/p-g", "9"),)))) == []
    assert step(life, pod("p", claim("p-g", node="n1"))) == []  # the cache's version 7: not yet
    (ungate,) = step(life, pod("p", replace(claim("p-g", node="n1"), resource_version="9")))
    assert isinstance(ungate, WriteAllocation) and ungate.ungate and ungate.pods[0].member.todo == []
    assert ungate.pods[0].ungated is None  # no Event: its claims are ours
    assert len(planner.calls) == 1


def test_a_written_claim_whose_device_another_claim_holds_moves_before_the_pod_is_ungated() -> None:
    life, _planner = make()
    step(life, pod("p", claim("p-g")))
    mine = replace(claim("p-g", node="n1"), resource_version="9")
    gone = step(life, pod("p", claim("p-g"), outcome=Outcome(written=(("default/p-g", "9"),))))
    assert gone == []
    contested = pod("p", mine, contested=[mine], rivals={"default/p-g": ("default/theirs",)})
    actions = step(life, contested)
    assert kinds(actions) == ["Event:DRAReallocated", "MoveClaims"]
    move = actions[1]
    assert isinstance(move, MoveClaims) and [c.key for c in move.claims] == ["default/p-g"]
    assert move.placed.answer is not None and move.placed.member.todo[0].allocation is None
    assert isinstance(actions[0], Event)
    assert actions[0].note == "devices of default/p-g are also in default/theirs; claims moved"
    # Moved (written again at 12): still gated until the cache shows 12, then ungated.
    assert step(life, pod("p", mine, outcome=Outcome(written=(("default/p-g", "12"),)))) == []
    assert step(life, pod("p", mine)) == []
    (ungate,) = step(life, pod("p", replace(mine, resource_version="12")))
    assert isinstance(ungate, WriteAllocation) and ungate.ungate


def test_two_pods_in_one_pass_never_get_the_same_device() -> None:
    life, planner = make()
    planner.free = {"n1": ["gpu-0"]}
    actions = step(life, pod("a", claim("a-g")), pod("b", claim("b-g")))
    assert kinds(actions) == ["Forget", "WriteAllocation", "Event:DRAAllocationFailed", "Retry"]
    assert actions[3] == Retry("default/b")
    assert isinstance(actions[2], Event) and actions[2].note == "0/2 nodes can take the claims"


def test_a_refused_claim_says_why_and_is_retried_without_placing() -> None:
    life, planner = make()
    actions = step(life, pod("p", claim("p-g"), refused="claim default/p-g: hands out whole devices"))
    assert kinds(actions) == ["Event:DRAClaimRefused", "Retry"]
    assert isinstance(actions[0], Event) and actions[0].type == "Warning"
    assert (
        actions[0].note == "claim default/p-g: hands out whole devices" and actions[0].action == "Allocating"
    )
    assert planner.calls == []


def test_a_pod_whose_claims_are_not_made_yet_waits_quietly() -> None:
    life, planner = make()
    assert step(life, pod("p", waiting="claim gpus (template t) is not made yet")) == []
    assert planner.calls == []


def test_a_pod_with_nothing_to_allocate_is_ungated_with_an_event_once_its_gate_is_gone() -> None:
    life, planner = make()
    (write,) = step(life, pod("p", left=["default/p-g: opted out"]))
    assert isinstance(write, WriteAllocation) and write.ungate
    (placed,) = write.pods
    assert placed.answer is None and placed.member.todo == [] and placed.written is None
    assert placed.ungated is not None and placed.ungated.reason == "DRALeftToKubeScheduler"
    assert placed.ungated.note == "default/p-g: opted out" and placed.ungated.type == "Normal"
    (again,) = step(life, pod("q", claim("shared", node="n1")))
    assert isinstance(again, WriteAllocation) and again.pods[0].ungated is not None
    assert again.pods[0].ungated.note == "its claims are allocated"
    assert planner.calls == []


def test_a_pod_pinned_by_an_allocated_claim_is_placed_on_that_node() -> None:
    life, planner = make()
    actions = step(life, pod("p", claim("shared", node="n2"), claim("p-g")))
    assert kinds(actions) == ["Forget", "WriteAllocation"]
    write = actions[1]
    assert isinstance(write, WriteAllocation)
    assert write.pods[0].answer is not None and write.pods[0].answer.node == "n2"
    assert [c.key for c in write.pods[0].member.todo] == ["default/p-g"]
    assert planner.calls == [(["default/p"], frozenset())]


# -- gangs ----------------------------------------------------------------------------------------


def test_a_gang_of_claims_waits_for_its_size_then_is_placed_at_once() -> None:
    life, planner = make()
    first = pod("g-0", claim("g-0-c"), gang="default/g", size=2)
    assert step(life, first) == []  # one of two members
    assert planner.calls == []
    actions = step(life, first, pod("g-1", claim("g-1-c"), gang="default/g", size=2))
    assert kinds(actions) == ["Forget", "Forget", "WriteAllocation"]
    assert planner.calls == [(["default/g-0", "default/g-1"], frozenset())]
    write = actions[2]
    assert isinstance(write, WriteAllocation) and [p.member.key for p in write.pods] == [
        "default/g-0",
        "default/g-1",
    ]
    assert all(p.written is None for p in write.pods)  # the gang's own Events tell


def test_a_gang_that_does_not_fit_places_none_and_each_member_says_why() -> None:
    life, planner = make()
    members = [
        pod(f"g-{i}", claim(f"g-{i}-c"), claim(f"g-{i}-d"), gang="default/g", size=3) for i in range(3)
    ]
    actions = step(life, *members)
    assert kinds(actions) == ["Event:DRAAllocationFailed", "Retry"] * 3
    notes = [a.note for a in actions if isinstance(a, Event)]
    assert notes == ["gang default/g: 0/2 nodes can take the claims"] * 3
    assert [a.key for a in actions if isinstance(a, Retry)] == [m.key for m in members]
    assert planner.calls == [([m.key for m in members], frozenset())]  # once, all of them together


def test_a_gang_member_whose_claim_is_not_made_holds_the_whole_gang() -> None:
    life, planner = make()
    ready = pod("g-0", claim("g-0-c"), gang="default/g", size=2)
    late = pod(
        "g-1",
        claim("g-1-c"),
        gang="default/g",
        size=2,
        waiting="ResourceClaim default/g-1-c does not exist yet",
    )
    assert step(life, ready, late) == [] and planner.calls == []


# -- what came back from the writes ---------------------------------------------------------------


def test_a_failed_write_says_why_and_retries_without_placing_again() -> None:
    life, planner = make()
    actions = step(life, pod("p", claim("p-g"), outcome=Outcome(failed="409 Conflict")))
    assert kinds(actions) == ["Event:DRAAllocationFailed", "Retry"]
    assert isinstance(actions[0], Event) and actions[0].note == "writing the claims' allocation: 409 Conflict"
    assert planner.calls == []


def test_a_refused_gate_removal_is_retried() -> None:
    life, planner = make()
    assert step(life, pod("p", claim("p-g", node="n1"), outcome=Outcome(gate_refused=True))) == [
        Retry("default/p")
    ]
    assert planner.calls == []


def test_a_pod_whose_gate_went_is_not_written_again_while_the_watch_still_shows_it_gated() -> None:
    life, planner = make()
    stale = pod("p", claim("p-g"), outcome=Outcome(ungated=True))
    assert step(life, stale) == []
    assert step(life, replace(stale, outcome=None)) == []  # still stale, no outcome: still known gone
    assert planner.calls == []
    assert step(life, replace(stale, gated=False, outcome=None)) == []  # the watch caught up
    # A new pod of the same name is gated anew: it is placed.
    assert kinds(step(life, replace(stale, uid="uid-new", outcome=None))) == ["Forget", "WriteAllocation"]


# -- ungated, refused by kube-scheduler where its claims are --------------------------------------


def test_claims_of_a_pod_kube_scheduler_refused_move_elsewhere_once_per_reason() -> None:
    life, planner = make()
    refused = pod("p", claim("p-g", node="n1"), gated=False, unschedulable="1 Insufficient cpu")
    actions = step(life, refused, now=100.0)
    assert kinds(actions) == ["Event:DRAReallocated", "MoveClaims"]
    assert planner.calls == [(["default/p"], frozenset({"n1"}))]
    assert isinstance(actions[0], Event)
    assert (
        actions[0].note
        == "kube-scheduler could not place the pod on n1 (1 Insufficient cpu); claims moved to n2"
    )
    move = actions[1]
    assert isinstance(move, MoveClaims) and [c.key for c in move.claims] == ["default/p-g"]
    assert move.claims[0].allocation is not None  # cleared as the cache has it (its version)
    assert move.placed.member.todo[0].allocation is None  # placed as if unallocated
    assert move.placed.answer is not None and move.placed.answer.node == "n2"
    assert move.placed.written is not None and move.placed.written.reason == "DRAAllocated"
    # The same reason again, before reallocate_after: left alone.
    assert step(life, refused, now=110.0) == []
    # Now on n2 and refused for a new reason: n1 and n2 are both left out, nowhere else to go.
    on_n2 = pod("p", claim("p-g", node="n2"), gated=False, unschedulable="1 node(s) had untolerated taint")
    assert kinds(step(life, on_n2, now=111.0)) == ["Event:DRAReallocationFailed"]
    assert planner.calls[-1] == (["default/p"], frozenset({"n1", "n2"}))


def test_claims_reserved_for_the_refused_pod_itself_move_with_their_reservation() -> None:
    life, planner = make()
    mine = replace(claim("p-g", node="n1"), reserved_for=(Consumer("pods", "p", "uid-p"),))
    actions = step(life, pod("p", mine, gated=False, unschedulable="1 Insufficient cpu"))
    assert kinds(actions) == ["Event:DRAReallocated", "MoveClaims"]
    move = actions[1]
    assert isinstance(move, MoveClaims) and move.claims[0].reserved_for  # cleared as the cache has it
    assert move.placed.answer is not None and move.placed.answer.node == "n2"
    # Reserved for another pod as well: not ours to move.
    both = replace(mine, reserved_for=(*mine.reserved_for, Consumer("pods", "x", "uid-x")))
    assert step(life, pod("q", both, gated=False, unschedulable="no")) == []
    assert planner.calls == [(["default/p"], frozenset({"n1"}))]


def test_the_same_reason_moves_the_claims_again_after_reallocate_after() -> None:
    life, planner = make()
    refused = pod("p", claim("p-g", node="n1"), gated=False, unschedulable="no")
    step(life, refused, now=100.0)
    assert kinds(step(life, refused, now=100.0 + SETTINGS.reallocate_after)) == [
        "Event:DRAReallocationFailed"
    ]
    assert planner.calls == [(["default/p"], frozenset({"n1"}))] * 2  # n2's one GPU went to the first move


def test_claims_not_ours_reserved_or_beside_claims_to_allocate_are_not_moved() -> None:
    life, planner = make()
    for claims in (
        (claim("a", node="n1", ours=False),),
        (claim("a", node="n1", reserved=True),),
        (claim("a", node="n1"), claim("b", node="n1", ours=False)),
        (claim("a", node="n1"), claim("b")),
    ):
        assert step(life, pod("p", *claims, gated=False, unschedulable="no")) == []
    assert step(life, pod("p", claim("a", node="n1"), gated=False)) == []  # not refused: on its way
    assert planner.calls == []


def test_a_pod_gone_and_back_starts_its_moves_afresh() -> None:
    life, planner = make()
    planner.free["n2"] = ["gpu-0", "gpu-1"]
    refused = pod("p", claim("p-g", node="n1"), gated=False, unschedulable="no")
    step(life, refused, now=100.0)
    life.gone("default/p")
    assert kinds(step(life, refused, now=101.0)) == ["Event:DRAReallocated", "MoveClaims"]
    assert planner.calls[-1] == (["default/p"], frozenset({"n1"}))  # n1 alone left out, as at first


# -- release --------------------------------------------------------------------------------------


def test_a_claim_nothing_uses_is_released_after_the_pause_in_a_full_pass() -> None:
    life, planner = make()
    unused = claim("standalone", node="n1")
    assert step(life, full=True, claims=[unused], now=100.0) == []
    assert step(life, full=True, claims=[unused], now=129.0) == []
    assert step(life, claims=[unused], now=131.0) == []  # not a full pass: claims are not looked at
    assert step(life, full=True, claims=[unused], now=131.0) == [ReleaseClaim(unused)]
    # Its clock starts again: should the release not go through, it is tried after another pause.
    assert step(life, full=True, claims=[unused], now=132.0) == []
    assert step(life, full=True, claims=[unused], now=162.0) == [ReleaseClaim(unused)]
    assert planner.calls == []


def test_claims_in_use_are_never_released_and_their_clock_stops() -> None:
    life, planner = make()
    named, held = claim("named", node="n1"), claim("held", node="n1")
    others = [
        claim("reserved", node="n1", reserved=True),
        claim("made-for-a-pod", node="n1", owner="uid-p"),
        claim("theirs", node="n1", ours=False),
        claim("unallocated"),
        replace(claim("deleting", node="n1"), deleting=True),
    ]
    everything = [named, held, *others]
    used = {"referenced": {"default/named"}, "held": {"claim:default/held"}}
    for now in (100.0, 200.0):
        assert step(life, full=True, claims=everything, now=now, **used) == []
    # No longer named: its clock starts now, not when it was first seen.
    assert step(life, full=True, claims=[named], now=201.0) == []
    assert step(life, full=True, claims=[named], now=231.0) == [ReleaseClaim(named)]
    assert planner.calls == []


def test_step_down_forgets_everything() -> None:
    life, planner = make()
    unused = claim("standalone", node="n1")
    step(life, full=True, claims=[unused], now=100.0)
    life.reset()
    assert step(life, full=True, claims=[unused], now=131.0) == []
    assert step(life, full=True, claims=[unused], now=161.0) == [ReleaseClaim(unused)]
    assert planner.calls == []
