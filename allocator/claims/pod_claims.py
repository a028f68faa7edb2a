"""A pod's claims as the watch cache has them, sorted by what topoalloc does with each.

A pod names its claims in spec.resourceClaims: a ResourceClaim directly, or a template from which
kube-controller-manager's resourceclaim controller makes one (recorded in
status.resourceClaimStatuses, the claim controlled by the pod). Until every claim exists the pod
waits. Each claim is then topoalloc's to allocate, already allocated (by anyone: it pins the pod to
its node), another driver's or left to kube-scheduler (opted out, or using what topoalloc leaves to
it), or refused with a reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from allocator.claims.cache_view import DraView
from allocator.core.request.claims import LEAVE, OURS, REFUSE, classify
from apis.dra_claims import ClaimSpec, ResourceClaim, claim_name, pod_claims
from apis.errors import CodecError

JSON = dict[str, Any]


@dataclass
class PodClaims:
    waiting: str = ""  # why not every claim exists yet ("" once they all do)
    refused: str = ""  # why topoalloc will never allocate them as written
    todo: list[ResourceClaim] = field(default_factory=list)  # topoalloc's, not allocated yet
    allocated: list[ResourceClaim] = field(default_factory=list)  # topoalloc.io's, allocated by anyone
    left: list[str] = field(default_factory=list)  # claims left to kube-scheduler, and why
    pinned: str = ""  # the node the allocated claims require ("" none)

    @property
    def ready(self) -> bool:
        return not self.waiting and not self.refused


def resolve(pod: JSON, dra: DraView) -> PodClaims:
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
