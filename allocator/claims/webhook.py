"""The DRA admission route: a pod whose claims topoalloc allocates gets the gate `topoalloc.io/dra`
at creation, so kube-scheduler does not allocate them first fit before the claims controller has.

A pod is gated when one of its spec.resourceClaims names a ResourceClaimTemplate, or a ResourceClaim
not allocated yet, whose requests use topoalloc's DeviceClasses the way topoalloc allocates them, or
in a way it refuses (allocator/core/request/claims.py `classify`; read from this replica's watch
cache), unless the claim or template opts out. Pods created bound, for a scheduler we do not serve,
or naming only other claims pass unchanged; so does every pod while the cache has not synced (the
webhook fails open: kube-scheduler then allocates, and the devices still count as used).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from allocator.claims.cache_view import DraView
from allocator.claims.pod_claims import gates_for
from allocator.runtime.admission import BadReview, add_gate, denied, patched, pod_create
from apis import dra
from apis.dra_claims import ResourceClaimTemplate, pod_claims
from apis.errors import CodecError

JSON = dict[str, Any]
PATH = "/mutate-pods-dra"


def gate_patch(pod: JSON, view: DraView, scheduler_names: Sequence[str] = ()) -> list[JSON] | None:
    """JSON patch operations adding the DRA gate, or None when the pod is left alone."""
    meta, spec = pod.get("metadata"), pod.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        raise BadReview("the object is not a Pod: metadata and spec must be objects")
    if spec.get("nodeName") or not spec.get("resourceClaims"):
        return None
    scheduler = spec.get("schedulerName") or "default-scheduler"
    if scheduler_names and scheduler not in scheduler_names:
        return None
    namespace = meta.get("namespace") or "default"
    try:
        refs = pod_claims(pod)
    except CodecError:
        return None  # the API server refuses such a pod anyway
    for ref in refs:
        if ref.template_name:
            tmpl = view.templates.get(f"{namespace}/{ref.template_name}")
            if isinstance(tmpl, ResourceClaimTemplate) and gates_for(tmpl.spec, opted_out=tmpl.opted_out):
                return add_gate(spec, dra.SCHEDULING_GATE)
            continue
        entry = view.claims.get(f"{namespace}/{ref.claim_name}")
        claim = entry.claim if entry is not None else None
        if claim is None or claim.allocation is not None:
            continue  # unknown yet, or allocated: kube-scheduler only follows its node selector
        if gates_for(claim.spec, opted_out=claim.opted_out):
            return add_gate(spec, dra.SCHEDULING_GATE)
    return None


def reviewer(
    view: DraView, synced: Callable[[], bool], scheduler_names: Sequence[str] = ()
) -> Callable[[JSON], JSON]:
    def review(request: JSON) -> JSON:
        pod = pod_create(request)
        if pod is None or not synced():
            return patched(request["uid"], None)
        try:
            return patched(request["uid"], gate_patch(pod, view, scheduler_names))
        except BadReview as exc:
            return denied(request["uid"], str(exc))

    return review
