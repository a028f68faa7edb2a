"""The claims lifecycle: one pure step per pass deciding what becomes of pending pods that name
ResourceClaims; the caller acts (allocator/claims/controller.py).

    ClaimsLifecycle(planner, settings).step(view, now) -> actions

`view` is what the pass looks at (view.py), `now` the caller's monotonic clock, `planner` the door
to the core's placement and the hold ledger: it places a pod's claims (or a gang's) and holds their
devices at once, so a later decision of the same pass never gets the same device. The step does no
I/O and reads no clock; it remembers, between passes, the pods whose claims it moved, the unused
claims it waits to release, and the pods whose gate it knows gone. Per pod, in key order:

1. Gated (`topoalloc.io/dra`): once every claim exists, the claims topoalloc allocates are placed
   together (pinned to the node of claims already allocated) and written, each allocated and
   reserved for the pod in one write (`WriteAllocation`; no Event: the claims show it). The
   gate stays until the cache shows every claim at the version its write returned: kube-scheduler,
   whose cache lags about as much, then sees the claims allocated when it sees the pod, and every
   claim allocated before ours is in the cache. A claim of ours whose device another claim holds
   then moves before the pod is ungated (`MoveClaims`); otherwise the gate goes. A pod with nothing
   to write is only ungated. A gang's members with claims
   to allocate are placed all at once, and only once the gang has its size. A claim that cannot be
   allocated as written, or a pod (gang) that fits nowhere now: an Event says why and the pod is
   tried again after its backoff pause (`Retry`; at once when it or its claims change).
2. Ungated, refused by kube-scheduler (PodScheduled=False/Unschedulable) while claims topoalloc
   allocated for it are reserved for no other pod: they move (allocation and reservation cleared)
   to another node, the refused ones left out (`MoveClaims`); again only when kube-scheduler's
   reason changes or after `reallocate_after`.
3. A write that failed comes back (`Outcome`): an Event says why and the pod is tried again later.
In a full pass, claims topoalloc allocated that nothing uses (not reserved, no pending pod names
them, not made for a pod, not held) are released after `release_after` (`ReleaseClaim`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from allocator.core.actions import Event, Forget, Retry
from allocator.core.claims.solve import ClaimAnswer
from allocator.core.claims.view import ClaimsView, Member, PendingPod
from allocator.core.request.usage import claim_usage_key
from apis import dra
from apis.dra_claims import ResourceClaim

ACTION = "Allocating"  # the Events' action


class ClaimsPlanner(Protocol):
    def place(
        self, members: Sequence[Member], refused: frozenset[str] = frozenset()
    ) -> list[ClaimAnswer] | str:
        """Place every member's claims together (one pod alone, a gang at once) on a node not in
        `refused`, and hold their devices in the hold ledger at once; the answers in the members'
        order, or why not (an Event's note)."""
        ...


@dataclass(frozen=True)
class ClaimsLifecycleSettings:
    reallocate_after: float = 20.0
    release_after: float = 30.0


# -- the claims' own actions (the shared ones: allocator/core/actions.py) ------------------------


@dataclass(frozen=True)
class Placed:
    """One pod's part of a `WriteAllocation`: its claims written as `answer` places them (none:
    nothing to write), `written` recorded once they are, `ungated` once its gate is gone."""

    member: Member
    answer: ClaimAnswer | None = None
    written: Event | None = None
    ungated: Event | None = None


@dataclass(frozen=True)
class WriteAllocation:
    """Write every pod's claims (each marked as topoalloc's unless the admission webhook marked it at
    creation, then its allocation), all or none: a failure rolls back the claims written, drops the
    pods' holds and comes back to each pod's next step (`Outcome.failed`), success with the versions
    written (`Outcome.written`). With `ungate` (a pod with nothing to write), remove each pod's gate
    (`Outcome.ungated`, or `gate_refused`)."""

    pods: tuple[Placed, ...]
    ungate: bool = True


@dataclass(frozen=True)
class MoveClaims:
    """Clear the allocation of `claims` (as the cache has them), then write them for `placed` (a
    `WriteAllocation` without ungating). A clear refused drops the holds: the pod is looked at
    again as it is."""

    claims: tuple[ResourceClaim, ...]
    placed: Placed


@dataclass(frozen=True)
class ReleaseClaim:
    """Clear the allocation of a claim nothing uses."""

    claim: ResourceClaim


Action = Event | Retry | Forget | WriteAllocation | MoveClaims | ReleaseClaim


# -- what the lifecycle remembers -------------------------------------------------------------------


@dataclass
class Moved:
    """A pod whose claims were moved: the nodes kube-scheduler refused, and the reason it gave
    at the time (another move waits for a new reason or `reallocate_after`)."""

    uid: str
    refused: set[str] = field(default_factory=set)
    message: str = ""
    at: float = 0.0


@dataclass(frozen=True)
class Written:
    """A gated pod whose claims were written: the versions the cache must show before its gate goes."""

    uid: str
    versions: tuple[tuple[str, str], ...]


def caught_up(seen: str, wrote: str) -> bool:
    """The cache's version of a claim is the write's or later (resourceVersions are etcd revisions;
    one that is not a number is taken as caught up, the write's answer then being all we have)."""
    try:
        return int(seen) >= int(wrote)
    except ValueError:
        return True


@dataclass
class ClaimsState:
    moved: dict[str, Moved] = field(default_factory=dict)
    unused: dict[str, float] = field(default_factory=dict)  # claim key -> first seen unused
    ungated: dict[str, str] = field(default_factory=dict)  # pod key -> uid: its gate is gone
    written: dict[str, Written] = field(default_factory=dict)  # pod key -> its claims' writes


class ClaimsLifecycle:
    def __init__(self, planner: ClaimsPlanner, settings: ClaimsLifecycleSettings) -> None:
        self.planner = planner
        self.settings = settings
        self.state = ClaimsState()

    def gone(self, key: str) -> None:
        """The pod is no longer pending (bound, finished, deleted): nothing of it is kept."""
        self.state.moved.pop(key, None)
        self.state.ungated.pop(key, None)
        self.state.written.pop(key, None)

    def reset(self) -> None:
        """Leadership lost: the next leader starts from what the cluster shows."""
        self.state = ClaimsState()

    def step(self, view: ClaimsView, now: float) -> list[Action]:
        out: list[Action] = []
        gangs: dict[str, list[PendingPod]] = {}
        for pod in view.pods:
            if self._heard(pod, out):
                continue
            if not pod.gated:
                self.state.ungated.pop(pod.key, None)
                self.state.written.pop(pod.key, None)
                self._refused(pod, now, out)
            elif self.state.ungated.get(pod.key) == pod.uid:
                pass  # its gate is gone: the watch has not shown it yet
            elif (written := self._written(pod)) is None:
                pass  # its claims' writes are not in the cache yet: their watch events wake it
            elif pod.gang and pod.claims.todo and not pod.claims.pinned:
                gangs.setdefault(pod.gang, []).append(pod)
            else:
                self._gated([pod], out, written=written)
        for gang, members in sorted(gangs.items()):
            self._gated(members, out, gang=gang)
        if view.full:
            self._release(view, now, out)
        return out

    # -- what became of the writes ---------------------------------------------------------------

    def _heard(self, pod: PendingPod, out: list[Action]) -> bool:
        """Take the pod's outcome in; whether it is all this step does for the pod."""
        got = pod.outcome
        if got is None:
            return False
        if got.ungated:
            self.state.ungated[pod.key] = pod.uid
        if got.written and got.failed is None:
            self.state.written[pod.key] = Written(pod.uid, got.written)
        if got.failed is not None:
            note = f"writing the claims' allocation: {got.failed}"
            out.append(Event(pod.ref, "Warning", "DRAAllocationFailed", note, ACTION))
        if got.failed is not None or got.gate_refused:
            out.append(Retry(pod.key))
            return True
        return False

    # -- 1. gated pods ---------------------------------------------------------------------------

    def _written(self, pod: PendingPod) -> bool | None:
        """None while the cache has not caught up with the writes of the pod's claims; else whether
        the pod had claims written by us (the cache now shows them all)."""
        mine = self.state.written.get(pod.key)
        if mine is None or mine.uid != pod.uid:
            self.state.written.pop(pod.key, None)
            return False
        seen = {c.key: c.resource_version for c in pod.claims.allocated}
        if not all(k in seen and caught_up(seen[k], rv) for k, rv in mine.versions):
            return None
        del self.state.written[pod.key]
        return True

    def _gated(
        self, pods: list[PendingPod], out: list[Action], *, gang: str = "", written: bool = False
    ) -> None:
        """Allocate the claims of `pods` (one pod, or the pending members of `gang`) all at once;
        ungate a pod with nothing (left) to allocate. `written`: the pod's claims are ours, just
        written and now seen."""
        for pod in pods:
            if pod.claims.waiting:
                return  # kube-controller-manager makes the claims; their changes wake the pod
            if pod.claims.refused:
                out.append(Event(pod.ref, "Warning", "DRAClaimRefused", pod.claims.refused, ACTION))
                out.append(Retry(pod.key))
                return
        todo = [p for p in pods if p.claims.todo]
        for pod in pods:
            if pod.claims.todo:
                continue
            if pod.claims.contested:
                self._contested(pod, out)
                continue
            left = None
            if pod.claims.left or not written:
                note = "; ".join(pod.claims.left) if pod.claims.left else "its claims are allocated"
                left = Event(pod.ref, "Normal", "DRALeftToKubeScheduler", note, ACTION)
            out.append(WriteAllocation((Placed(Member(pod.key, pod.pod, []), ungated=left),)))
        if not todo or (gang and len(todo) < todo[0].gang_size):
            return  # a gang waits until it has its size
        members = [Member(p.key, p.pod, p.claims.todo, p.claims.pinned) for p in todo]
        decided = self.planner.place(members)
        if isinstance(decided, str):
            for pod in todo:
                note = f"gang {gang}: {decided}" if gang else decided
                out.append(Event(pod.ref, "Warning", "DRAAllocationFailed", note, ACTION))
                out.append(Retry(pod.key))
            return
        out.extend(Forget(p.key) for p in todo)
        # No Event for a plain allocation (a write per pod that kube-scheduler's own path does not
        # make): the claims' status shows the devices, kube-scheduler's Scheduled Event the node.
        placed = (Placed(m, answer) for m, answer in zip(members, decided, strict=True))
        out.append(WriteAllocation(tuple(placed), ungate=False))

    def _contested(self, pod: PendingPod, out: list[Action]) -> None:
        """The pod is still gated and a device of its claims is in another claim too (kube-scheduler
        allocated it before seeing ours, or ours landed after theirs): its claims move, the other
        claim keeps the device, and the gate stays until the moved claims are seen."""
        claims = pod.claims.contested
        rivals = sorted({r for c in claims for r in pod.claims.rivals.get(c.key, ())})
        member = Member(pod.key, pod.pod, [replace(c, allocation=None) for c in claims], pod.claims.pinned)
        if len(claims) == len(pod.claims.allocated):
            member = replace(member, pinned="")  # nothing else pins it: any node will do
        decided = self.planner.place([member])
        shared = f"devices of {', '.join(c.key for c in claims)} are also in {', '.join(rivals)}"
        if isinstance(decided, str):
            out.append(Event(pod.ref, "Warning", "DRAReallocationFailed", f"{shared}: {decided}", ACTION))
            out.append(Retry(pod.key))
            return
        (answer,) = decided
        out.append(Event(pod.ref, "Warning", "DRAReallocated", f"{shared}; claims moved", ACTION))
        written = Event(pod.ref, "Normal", "DRAAllocated", allocated(answer), ACTION)
        out.append(MoveClaims(tuple(claims), Placed(member, answer, written)))

    # -- 2. ungated, refused where its claims are ------------------------------------------------

    def _refused(self, pod: PendingPod, now: float, out: list[Action]) -> None:
        message, claims = pod.unschedulable, pod.claims
        if message is None or claims.refused:
            return
        # Ours and reserved for no other pod (the allocation's own write reserved it for this one).
        ours = [c for c in claims.allocated if c.allocated_by_us and reserved_at_most_for(c, pod.uid)]
        if not ours or len(ours) != len(claims.allocated) or claims.todo:
            return  # not ours to move (or other claims pin the pod): kube-scheduler's to report
        moved = self.state.moved.get(pod.key)
        if moved is None or moved.uid != pod.uid:
            moved = self.state.moved[pod.key] = Moved(pod.uid)
        elif moved.message == message and now - moved.at < self.settings.reallocate_after:
            return
        node = claims.pinned
        moved.refused.add(node)
        moved.message, moved.at = message, now
        # What the pod can be placed against: these claims as if unallocated.
        member = Member(pod.key, pod.pod, [replace(c, allocation=None) for c in ours])
        decided = self.planner.place([member], frozenset(moved.refused))
        if isinstance(decided, str):
            note = f"kube-scheduler refused {node}: {decided}"
            out.append(Event(pod.ref, "Warning", "DRAReallocationFailed", note, ACTION))
            return
        (answer,) = decided
        note = f"kube-scheduler could not place the pod on {node} ({message}); claims moved to {answer.node}"
        out.append(Event(pod.ref, "Warning", "DRAReallocated", note, ACTION))
        written = Event(pod.ref, "Normal", "DRAAllocated", allocated(answer), ACTION)
        out.append(MoveClaims(tuple(ours), Placed(member, answer, written)))

    # -- release ---------------------------------------------------------------------------------

    def _release(self, view: ClaimsView, now: float, out: list[Action]) -> None:
        unused = set()
        for c in view.claims:
            if not c.allocated_by_us or c.reserved_for or c.deleting or c.owner_pod:
                continue
            if c.annotation(dra.ANNOUNCES_ANNOTATION):
                continue  # it holds a device in kube-scheduler's count (allocator/claims/race.py)
            if c.key in view.referenced or claim_usage_key(c.key) in view.held:
                continue
            unused.add(c.key)
            first = self.state.unused.setdefault(c.key, now)
            if now - first >= self.settings.release_after:
                out.append(ReleaseClaim(c))
                unused.discard(c.key)  # its clock starts again should the release not go through
        self.state.unused = {k: t for k, t in self.state.unused.items() if k in unused}


def reserved_at_most_for(claim: ResourceClaim, uid: str) -> bool:
    """The claim is reserved for nobody, or only for the pod `uid`."""
    return all(r.resource == "pods" and r.uid == uid for r in claim.reserved_for)


def allocated(answer: ClaimAnswer) -> str:
    """The note of a pod's DRAAllocated Event."""
    devices = "; ".join(f"{k}: {', '.join(r.device for r in rs)}" for k, rs in answer.results.items())
    return f"claims allocated on {answer.node} ({devices})"
