"""The DRA admission routes: a pod whose claims topoalloc allocates gets the gate `topoalloc.io/dra`
at creation, so kube-scheduler does not allocate them first fit before the claims controller has;
a ResourceClaim topoalloc allocates is marked `topoalloc.io/allocated-by: topoalloc` at its creation,
so that marking it costs no write of its own (the controller marks a claim created unmarked, with
no webhook answering, before its allocation).

A pod is gated when one of its spec.resourceClaims names a ResourceClaimTemplate, or a ResourceClaim
not allocated yet, whose requests use topoalloc's DeviceClasses the way topoalloc allocates them, or
in a way it refuses (allocator/core/request/claims.py `classify`; read from this replica's watch
cache), unless the claim or template opts out. Pods created bound, for a scheduler we do not serve,
or naming only other claims pass unchanged; so does every pod while the cache has not synced (the
webhook fails open: kube-scheduler then allocates, and the devices still count as used).

A claim or template asking a GPU share (`capacity.requests`) is refused at its creation where the
cluster's GPUs are published whole only: an API server that does not keep consumable capacity
(before 1.36) drops the field on write, after admission, and the claim would silently take a
whole GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from allocator.claims.cache_view import DraView
from allocator.claims.pod_claims import gates_for
from allocator.core.claims.published import NodeDevices, sharable_gpus
from allocator.core.request.claims import OURS, classify
from allocator.runtime.admission import BadReview, add_gate, denied, on_any_thread, patched, pod_create
from apis import dra
from apis.dra_claims import ClaimSpec, ResourceClaim, ResourceClaimTemplate, pod_claims
from apis.errors import CodecError

JSON = dict[str, Any]
PATH = "/mutate-pods-dra"
CLAIMS_PATH = "/mutate-claims-dra"  # the mark on claims topoalloc allocates, set at their creation


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

    return on_any_thread(review)  # single-key lookups of the cache


def mark_patch(claim: JSON) -> list[JSON] | None:
    """JSON patch operations adding the mark to a claim topoalloc allocates, or None."""
    meta = claim.get("metadata")
    if not isinstance(meta, dict):
        raise BadReview("the object is not a ResourceClaim: metadata must be an object")
    try:
        parsed = ResourceClaim.from_dict(claim)
    except CodecError:
        return None  # the API server refuses such a claim anyway
    if parsed.allocation is not None or classify(parsed.spec, opted_out=parsed.opted_out).kind != OURS:
        return None
    if parsed.annotation(dra.ALLOCATED_BY_ANNOTATION) == dra.ALLOCATED_BY:
        return None
    key = dra.ALLOCATED_BY_ANNOTATION.replace("~", "~0").replace("/", "~1")
    if not meta.get("annotations"):
        value = {dra.ALLOCATED_BY_ANNOTATION: dra.ALLOCATED_BY}
        return [{"op": "add", "path": "/metadata/annotations", "value": value}]
    return [{"op": "add", "path": f"/metadata/annotations/{key}", "value": dra.ALLOCATED_BY}]


def whole_only_refusal(spec: ClaimSpec, published: Mapping[str, NodeDevices]) -> str | None:
    """Why a claim asking a GPU share is refused at its creation: some node publishes GPUs and none
    is sharable (None: it asks no share, or a node can serve one, or nothing is published yet)."""
    if not any(r.exactly is not None and r.exactly.capacity for r in spec.requests):
        return None
    # Snapshots (list() of a dict is atomic under the GIL): this runs on the admission thread.
    devices = (d for nd in list(published.values()) for d in list(nd.devices.values()))
    if sharable_gpus(devices) is not False:
        return None  # a node can serve a share, or no GPU is published yet
    return (
        "topoalloc.io: the cluster's GPUs are whole only: no node's ResourceSlices publish a GPU with"
        " allowMultipleAllocations (consumable capacity is off before Kubernetes 1.36), so the API server"
        " would store this request without its capacity.requests and it would take a whole GPU"
    )


def claim_reviewer(
    view: DraView | None = None, synced: Callable[[], bool] = lambda: True
) -> Callable[[JSON], JSON]:
    def review(request: JSON) -> JSON:
        kind = (request.get("kind") or {}).get("kind")
        obj = request.get("object")
        create = request.get("operation", "CREATE") == "CREATE"
        if not create or kind not in ("ResourceClaim", "ResourceClaimTemplate") or not isinstance(obj, dict):
            return patched(request["uid"], None)
        if view is not None and synced():
            try:
                parse = ResourceClaim if kind == "ResourceClaim" else ResourceClaimTemplate
                refusal = whole_only_refusal(parse.from_dict(obj).spec, view.published)
            except CodecError:
                refusal = None  # the API server refuses such an object anyway
            if refusal is not None:
                return denied(request["uid"], refusal)
        if kind != "ResourceClaim":
            return patched(request["uid"], None)
        try:
            return patched(request["uid"], mark_patch(obj))
        except BadReview as exc:
            return denied(request["uid"], str(exc))

    return on_any_thread(review)  # the published devices read from snapshots
