"""A device in two claims: what moves. Pure; the claims controller acts.

kube-scheduler's own allocator (claims opted out, or left to it) and topoalloc allocate from the same
ResourceSlices, each counting only the allocations its cache already has: both can write one device
into two claims. topoalloc keeps its pods gated until its cache shows its own writes, and moves its
claims that lost before ungating (lifecycle.py); what that cannot prevent, a claim kube-scheduler
allocated onto a device topoalloc already handed out after seeing it, is repaired here:

    repair(device, holders) -> actions

Of the claims holding the device, the claim that can still move moves: one not reserved by a pod
and whose pods are not bound (topoalloc's: allocated again elsewhere, `MoveClaim`; kube-scheduler's:
deallocated so that kube-scheduler allocates it again, `ClearClaim`). When none can, the claim
allocated first keeps the device and each later one's bound pods leave: evicted through their
controller (budgets honoured), which makes them again with new claims, or, a pod without one,
left where it is with an Event and a count. A claim whose pods are gated by topoalloc is left to
the lifecycle; one reserved by a pod not bound yet waits for the binding.

A bound pod whose claim topoalloc allocated, reserved for it, on another node (kube-scheduler
began a scheduling attempt while the claim still named the old node, and bound the pod there after
topoalloc moved it) cannot start: `misplaced(claim, pod, node)` evicts it the same way, for its
controller to make it again, or says it is stuck.

Shares of a device that takes several allocations (results with a shareID and consumedCapacity)
conflict only when together they exceed its capacity: the shares that fit, taken in the same order
(those that cannot move first, then by age), keep it; only the others move.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass

from allocator.core.actions import Count, Event, Evict, ObjectRef
from apis.dra_claims import ResourceClaim

ACTION = "Allocating"
REASON = "DRADeviceDoubleBooked"
MISPLACED = "DRAClaimOnAnotherNode"
METRIC = "double_booked"  # labels: moved, cleared, evicted, stuck


@dataclass(frozen=True)
class HolderPod:
    """A pod that names or reserves the claim."""

    key: str
    ref: ObjectRef
    bound: bool
    gated: bool  # topoalloc's DRA gate is on it
    controller: str = ""  # "Kind/name" of its controller, "" for a bare pod


@dataclass(frozen=True)
class Holder:
    claim: ResourceClaim
    since: int  # the resourceVersion at which its allocation was first seen
    pods: tuple[HolderPod, ...] = ()


@dataclass(frozen=True)
class ClearClaim:
    """Deallocate a claim kube-scheduler allocated (allocation and reservedFor removed, guarded by
    its resourceVersion): kube-scheduler allocates it again."""

    claim: ResourceClaim


@dataclass(frozen=True)
class MoveClaim:
    """Allocate a claim of topoalloc's again elsewhere for its (ungated, unbound) pod."""

    claim: ResourceClaim
    pod: HolderPod


Action = Event | Evict | Count | ClearClaim | MoveClaim


def movable(h: Holder) -> bool:
    return not h.claim.reserved_for and not h.claim.deleting and not any(p.bound for p in h.pods)


def gated_by_us(h: Holder) -> bool:
    return h.claim.allocated_by_us and bool(h.pods) and all(p.gated for p in h.pods)


Use = tuple[tuple[str, int], ...] | None  # a share's consumed capacity (whole units); None: whole


def overflows(uses: Sequence[Use], capacity: Mapping[str, int] | None) -> bool:
    """Whether these holders of one device cannot all have it: one holds it whole, or their shares
    together exceed a capacity (or the device's capacity is not known: never risk it)."""
    if len(uses) < 2:
        return False
    if capacity is None or any(u is None for u in uses):
        return True
    total: dict[str, int] = {}
    for u in uses:
        for name, value in u or ():
            total[name] = total.get(name, 0) + value
    return any(value > capacity.get(name, value) for name, value in total.items())


def use_of(claim: ResourceClaim, device: str) -> Use:
    """What the claim's result for `device` ("<pool>/<name>") consumes: a share's consumedCapacity,
    None for a whole allocation."""
    for r in claim.allocation.results if claim.allocation is not None else ():
        if f"{r.pool}/{r.device}" == device and not r.admin_access:
            if not r.share_id or not r.consumed:
                return None
            return tuple(sorted((name, q.value()) for name, q in r.consumed))
    return None


def repair(
    device: str,
    holders: Sequence[Holder],
    done: Container[str] = frozenset(),
    capacity: Mapping[str, int] | None = None,
) -> list[Action]:
    """What becomes of the claims holding `device` ("<pool>/<name>"); nothing while one of them
    waits at topoalloc's gate (that one moves before its pod goes) or a pod is being bound.
    `done`: claims already acted on (their moves, evictions or Events are not repeated);
    `capacity`: the device's capacities, for shares."""
    if len(holders) < 2 or any(gated_by_us(h) for h in holders):
        return []
    order = sorted(holders, key=lambda h: (h.since, h.claim.key))
    fixed = [h for h in order if not movable(h)]
    ranked = fixed + [h for h in order if movable(h)]
    keep, kept = ranked[0], [ranked[0]]
    for h in ranked[1:]:
        if not overflows([use_of(k.claim, device) for k in (*kept, h)], capacity):
            kept.append(h)
    out: list[Action] = []
    for h in order:
        if any(h is k for k in kept) or h.claim.key in done:
            continue
        why = f"device {device} is in claim {h.claim.key} and in claim {keep.claim.key} (allocated first)"
        if movable(h):
            if h.claim.allocated_by_us and len(h.pods) == 1:
                out.append(MoveClaim(h.claim, h.pods[0]))
                out.append(Count(METRIC, "moved"))
                note = f"{why}: claim {h.claim.key} is allocated again"
            else:
                out.append(ClearClaim(h.claim))
                out.append(Count(METRIC, "cleared"))
                note = f"{why}: claim {h.claim.key} is deallocated for kube-scheduler to allocate again"
            out.extend(Event(p.ref, "Warning", REASON, note, ACTION) for p in h.pods)
        elif h.pods and all(p.bound for p in h.pods):
            for p in h.pods:
                if p.controller:
                    out.append(Evict(p.ref, owner=p.key))
                    out.append(Count(METRIC, "evicted"))
                    note = f"{why}: the pod is evicted for its controller ({p.controller}) to make it again"
                else:
                    out.append(Count(METRIC, "stuck"))
                    note = f"{why}: the pod has no controller to make it again and cannot be moved"
                out.append(Event(p.ref, "Warning", REASON, note, ACTION))
    return out


def misplaced(claim: ResourceClaim, pod: HolderPod, node: str) -> list[Action]:
    """A bound pod on `node` whose claim topoalloc allocated and reserved for it selects another
    node: the pod leaves through its controller (evicted, budgets honoured), or, without one, stays
    with an Event saying so. Nothing for a claim of anyone else, one reserved for another pod, or
    one whose node is the pod's."""
    alloc = claim.allocation
    if alloc is None or not claim.allocated_by_us or not alloc.node or not pod.bound or not node:
        return []
    if node == alloc.node or not any(
        c.resource == "pods" and c.uid == pod.ref.uid for c in claim.reserved_for
    ):
        return []
    why = f"claim {claim.key} is allocated on node {alloc.node} but the pod was bound to node {node}"
    if pod.controller:
        note = f"{why}: the pod is evicted for its controller ({pod.controller}) to make it again"
        out: list[Action] = [Evict(pod.ref, node, owner=pod.key), Count(METRIC, "evicted")]
    else:
        note = f"{why}: the pod has no controller to make it again and cannot be moved"
        out = [Count(METRIC, "stuck")]
    return [*out, Event(pod.ref, "Warning", MISPLACED, note, ACTION)]
