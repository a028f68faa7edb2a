"""The gang's admission route: gang members get the gang's scheduling gate at creation.

A gated pod is invisible to kube-scheduler until the gang controller has placed the whole gang and
removes the gate, so members never trickle onto nodes one by one. The AdmissionReview envelope and
the server are the runtime's (allocator/runtime/admission.py), shared with the DRA gate.

Answers: a member without the gate gets a patch adding it; any other pod (no gang, already gated,
created with `spec.nodeName`, for a scheduler we do not serve, a member of a Kubernetes-native gang
for a scheduler whose own gang plugin keeps those whole) is allowed unchanged; a pod whose
gang annotation does not decode is denied with the reason, so the user learns at once instead of
finding a pod that waits for ever.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web

from allocator.runtime.admission import BadReview, add_gate, admission_app, denied, patched, pod_create
from apis import keys
from apis.errors import CodecError
from apis.podgroup import gang_of

JSON = dict[str, Any]
PATH = "/mutate-pods"


def gate_patch(
    pod: JSON, scheduler_names: Sequence[str] = (), *, plugin_schedulers: Sequence[str] = ()
) -> list[JSON] | None:
    """JSON patch operations that add the gang gate, or None when the pod is left alone. Raises
    BadReview (→ denial) for a pod that is not one or names its gang wrongly."""
    meta, spec = pod.get("metadata"), pod.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        raise BadReview("the object is not a Pod: metadata and spec must be objects")
    try:
        gang = gang_of(pod)
    except (CodecError, AttributeError, TypeError) as exc:
        raise BadReview(f"invalid gang membership: {exc}") from None
    if gang is None or spec.get("nodeName"):
        return None  # no gang; or bound at creation, which a gated pod may not be
    scheduler = spec.get("schedulerName") or "default-scheduler"
    if scheduler_names and scheduler not in scheduler_names:
        return None
    if gang.native and scheduler in plugin_schedulers:
        return None  # kube-scheduler's gang plugin holds it; the extender steers it to its plan
    return add_gate(spec, keys.GANG_SCHEDULING_GATE)


def review_response(
    request: JSON, scheduler_names: Sequence[str] = (), *, plugin_schedulers: Sequence[str] = ()
) -> JSON:
    """The AdmissionResponse for a parsed request."""
    pod = pod_create(request)
    if pod is None:
        return patched(request["uid"], None)
    try:
        return patched(request["uid"], gate_patch(pod, scheduler_names, plugin_schedulers=plugin_schedulers))
    except BadReview as exc:
        return denied(request["uid"], str(exc))


def webhook_app(
    scheduler_names: Sequence[str] = (), *, plugin_schedulers: Sequence[str] = ()
) -> web.Application:
    return admission_app(
        {PATH: lambda review: review_response(review, scheduler_names, plugin_schedulers=plugin_schedulers)}
    )
