"""A pod's claims as the watch cache has them, sorted by what topoalloc does with each, and the
pending pod as the claims lifecycle sees it (allocator/core/claims/view.py).

A pod names its claims in spec.resourceClaims: a ResourceClaim directly, or a template from which
kube-controller-manager's resourceclaim controller makes one (recorded in
status.resourceClaimStatuses, the claim controlled by the pod). Until every claim exists the pod
waits. Each claim is then topoalloc's to allocate, already allocated (by anyone: it pins the pod to
its node), another driver's or left to kube-scheduler (opted out, or using what topoalloc leaves to
it), or refused with a reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from allocator.claims.cache_view import ClaimsCache, DraView
from allocator.core.claims.view import Outcome, PendingPod, PodClaims
from allocator.core.request.claims import LEAVE, OURS, REFUSE, classify
from allocator.runtime.cache.records import PodEntry
from apis import dra
from apis.dra_claims import ClaimSpec, claim_name, pod_claims
from apis.errors import CodecError
from apis.gang_object import read_gang_object
from apis.podgroup import KOORDINATOR_SOURCE, NATIVE_SOURCE, PODGROUP_SOURCE, WORKLOAD_SOURCE, gang_of

JSON = dict[str, Any]
NO_SIZE = 1 << 30  # a gang whose size is not known (yet) waits


Rivals = Callable[[str], tuple[str, ...]]  # claim key -> the other claims holding its devices


def _none(_key: str) -> tuple[str, ...]:
    return ()


def pending_pod(
    entry: PodEntry, cache: ClaimsCache, outcome: Outcome | None, rivals: Rivals = _none
) -> PendingPod | None:
    """The pod as the lifecycle sees it; None when there is nothing to look at (bound, deleting,
    or ungated and not refused by kube-scheduler: on its way to a node)."""
    pod = entry.raw
    if pod is None or entry.node or entry.deleting:
        return None
    gated = dra.SCHEDULING_GATE in gates(pod)
    message = unschedulable(pod)
    if not gated and message is None and outcome is None:
        return None
    size = gang_size(entry.gang, pod, cache) if entry.gang else 0
    claims = resolve(pod, cache.dra, rivals)
    return PendingPod(entry.key, entry.uid, pod, gated, message, claims, entry.gang, size, outcome)


def gates(pod: JSON) -> list[str]:
    found = (pod.get("spec") or {}).get("schedulingGates") or []
    return [g.get("name", "") for g in found if isinstance(g, dict)]


def unschedulable(pod: JSON) -> str | None:
    """kube-scheduler's message when it found no node for the pod (None otherwise)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            return str(cond.get("message") or "")
    return None


def gang_size(gang: str, pod: JSON, cache: ClaimsCache) -> int:
    """How many members the gang waits for: its object's minimum (either PodGroup, a Workload's
    pod group), or Koordinator's min-available (a Koordinator gang without one: the members there
    are)."""
    try:
        ref = gang_of(pod)
    except CodecError:
        ref = None
    if ref is None or ref.key != gang:
        return NO_SIZE  # the pod no longer names this gang: the next pass sees it as it is
    if ref.source == KOORDINATOR_SOURCE:
        return ref.min_available or 1  # without min-available: the members there are
    stores = {
        PODGROUP_SOURCE: cache.podgroups,
        NATIVE_SOURCE: cache.native_podgroups,
        WORKLOAD_SOURCE: cache.workloads,
    }
    found, _, _ = read_gang_object(ref, stores)
    return found.min_member if found is not None else NO_SIZE  # its object is not there (yet)


def resolve(pod: JSON, dra: DraView, rivals: Rivals = _none) -> PodClaims:
    meta = pod.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    uid = meta.get("uid") or ""
    out = PodClaims()
    try:
        refs = pod_claims(pod)
    except CodecError as exc:
        out.refused = f"the pod's resource claims do not decode: {exc}"
        return out
    nodes = set()
    for ref in refs:
        name = claim_name(ref)
        if name is None:
            out.waiting = f"claim {ref.name} (template {ref.template_name}) is not made yet"
            continue
        if not name:
            continue  # the resourceclaim controller decided the pod needs none
        key = f"{namespace}/{name}"
        entry = dra.claims.get(key)
        if entry is None:
            out.waiting = f"ResourceClaim {key} does not exist yet"
            continue
        claim = entry.claim
        if claim is None:
            out.refused = f"ResourceClaim {key} does not decode: {entry.error}"
            continue
        if ref.template_name and claim.owner_pod != uid:
            out.waiting = f"ResourceClaim {key} is not this pod's yet"
            continue
        verdict = classify(claim.spec, opted_out=claim.opted_out)
        if claim.allocation is not None:
            if claim.allocation.node:
                nodes.add(claim.allocation.node)
            if verdict.kind in (OURS, LEAVE) and any(
                r.driver == "topoalloc.io" for r in claim.allocation.results
            ):
                out.allocated.append(claim)
                if claim.allocated_by_us and (found := rivals(key)):
                    out.contested.append(claim)
                    out.rivals[key] = found
            continue
        if verdict.kind == REFUSE:
            out.refused = f"claim {key}: {verdict.reason}"
        elif verdict.kind == LEAVE:
            out.left.append(f"{key}: {verdict.reason}")
        elif verdict.kind == OURS:
            out.todo.append(claim)
    if len(nodes) > 1:
        out.refused = f"the pod's claims are allocated on different nodes ({', '.join(sorted(nodes))})"
    out.pinned = next(iter(nodes), "")
    return out


def gates_for(spec: ClaimSpec, *, opted_out: bool) -> bool:
    """Whether a claim (or a template's) holds its pod at the gate: topoalloc allocates it, or
    refuses it as written (the pod then waits with the reason rather than going to kube-scheduler
    with a claim of topoalloc.io devices it cannot serve)."""
    return classify(spec, opted_out=opted_out).kind in (OURS, REFUSE)
