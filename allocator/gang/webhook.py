"""The mutating admission webhook: gang members get the gang's scheduling gate at creation.

kube-apiserver POSTs an `admission.k8s.io/v1` AdmissionReview for every Pod CREATE the
MutatingWebhookConfiguration selects (deploy/allocator/webhook.yaml) and applies the JSON patch we
answer with. A gated pod is invisible to kube-scheduler until the gang controller has placed the
whole gang and removes the gate, so members never trickle onto nodes one by one.

Answers: a member without the gate gets a patch adding it; any other pod (no gang, already gated,
created with `spec.nodeName`, for a scheduler we do not serve, a member of a Kubernetes-native gang
for a scheduler whose own gang plugin keeps those whole) is allowed unchanged; a pod whose
gang annotation does not decode is denied with the reason, so the user learns at once instead of
finding a pod that waits for ever. A body that is not an AdmissionReview gets HTTP 400 with the
decoding error (the API server then applies the configuration's failurePolicy); never a 500.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from apis import keys
from apis.errors import CodecError
from apis.podgroup import gang_of

log = logging.getLogger(__name__)

JSON = dict[str, Any]
API_VERSION = "admission.k8s.io/v1"
PATH = "/mutate-pods"
MAX_BODY = 8 * 1024 * 1024  # a Pod is at most ~1.5 MB in etcd


class BadReview(ValueError):
    pass


def parse_review(data: Any) -> JSON:
    """The `request` of an AdmissionReview v1, checked for the fields we read."""
    if not isinstance(data, dict):
        raise BadReview("expected an AdmissionReview object")
    if data.get("apiVersion") != API_VERSION or data.get("kind") != "AdmissionReview":
        raise BadReview(
            f"expected apiVersion {API_VERSION} and kind AdmissionReview, got "
            f"{data.get('apiVersion')!r} and {data.get('kind')!r}"
        )
    request = data.get("request")
    if not isinstance(request, dict):
        raise BadReview("request: expected an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid: expected a non-empty string")
    for name in ("kind", "resource"):
        if request.get(name) is not None and not isinstance(request[name], dict):
            raise BadReview(f"request.{name}: expected an object")
    if request.get("object") is not None and not isinstance(request["object"], dict):
        raise BadReview("request.object: expected an object")
    return request


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
    gates = spec.get("schedulingGates")
    if gates is not None and not isinstance(gates, list):
        raise BadReview("spec.schedulingGates: expected a list")
    gate = {"name": keys.GANG_SCHEDULING_GATE}
    if not gates:
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [gate]}]
    if any(isinstance(g, dict) and g.get("name") == gate["name"] for g in gates):
        return None
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": gate}]


def review_response(
    request: JSON, scheduler_names: Sequence[str] = (), *, plugin_schedulers: Sequence[str] = ()
) -> JSON:
    """The AdmissionResponse for a parsed request."""
    uid = request["uid"]
    kind = request.get("kind") or {}
    pod = request.get("object")
    if request.get("operation", "CREATE") != "CREATE" or kind.get("kind", "Pod") != "Pod" or pod is None:
        return {"uid": uid, "allowed": True}
    try:
        patch = gate_patch(pod, scheduler_names, plugin_schedulers=plugin_schedulers)
    except BadReview as exc:
        return {
            "uid": uid,
            "allowed": False,
            "status": {"status": "Failure", "code": 400, "reason": "BadRequest", "message": str(exc)},
        }
    if patch is None:
        return {"uid": uid, "allowed": True}
    encoded = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    return {"uid": uid, "allowed": True, "patchType": "JSONPatch", "patch": encoded}


def webhook_app(
    scheduler_names: Sequence[str] = (), *, plugin_schedulers: Sequence[str] = ()
) -> web.Application:
    async def mutate(request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            review = parse_review(json.loads(raw))
        except (ValueError, UnicodeDecodeError) as exc:  # BadReview is a ValueError
            log.warning("admission review refused: %s", exc)
            return web.Response(status=400, text=f"not an AdmissionReview: {exc}\n")
        body = {
            "apiVersion": API_VERSION,
            "kind": "AdmissionReview",
            "response": review_response(review, scheduler_names, plugin_schedulers=plugin_schedulers),
        }
        return web.json_response(body)

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post(PATH, mutate)
    return app
