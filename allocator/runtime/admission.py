"""Mutating admission webhooks of the allocator: the AdmissionReview v1 envelope and one HTTPS
server for every route (the gang gate at /mutate-pods, the DRA gate at /mutate-pods-dra).

kube-apiserver POSTs an `admission.k8s.io/v1` AdmissionReview for every object the
MutatingWebhookConfiguration selects (deploy/allocator/webhook.yaml) and applies the JSON patch we
answer with. Each route is a `Reviewer`: the parsed request in, the AdmissionResponse out. A body
that is not an AdmissionReview gets HTTP 400 with the decoding error (the API server then applies
the webhook's failurePolicy); never a 500. Every route's answer to a pod creation carries the pod's
`warnings` (apis/pod_checks.py: unknown annotation keys, near-miss resource names), which kubectl
prints to whoever created it.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from aiohttp import web

from allocator.runtime.json_codec import dumps, loads
from apis.pod_checks import pod_warnings

log = logging.getLogger(__name__)

JSON = dict[str, Any]
API_VERSION = "admission.k8s.io/v1"
MAX_BODY = 8 * 1024 * 1024  # a Pod is at most ~1.5 MB in etcd
Reviewer = Callable[[JSON], JSON]
# How a route's handler has its reviewer answer: on the handler's own loop, or on the loop that owns
# the state the reviewer reads (allocator/runtime/admission_server.py).
Call = Callable[[Reviewer, JSON], Awaitable[JSON]]
R = TypeVar("R", bound=Reviewer)


def on_any_thread(reviewer: R) -> R:
    """Mark a reviewer that may answer on the admission server's own thread: it reads only its
    settings and lookups of single keys of the watch cache (atomic under the GIL), or iterates
    snapshots taken with list(); it writes nothing. Unmarked reviewers answer on the allocator's
    main loop, which owns the state they touch."""
    reviewer._on_any_thread = True  # type: ignore[attr-defined]
    return reviewer


def answers_on_any_thread(reviewer: Reviewer) -> bool:
    return bool(getattr(reviewer, "_on_any_thread", False))


async def answer_here(reviewer: Reviewer, review: JSON) -> JSON:
    """The reviewer's answer, on whichever loop awaits this."""
    return reviewer(review)


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


def pod_create(request: JSON) -> JSON | None:
    """The Pod a CREATE review is about; None for any other review (allowed unchanged)."""
    kind = request.get("kind") or {}
    if request.get("operation", "CREATE") != "CREATE" or kind.get("kind", "Pod") != "Pod":
        return None
    return request.get("object")


def patched(uid: str, patch: list[JSON] | None) -> JSON:
    """Allowed, with the JSON patch when there is one."""
    if not patch:
        return {"uid": uid, "allowed": True}
    encoded = base64.b64encode(dumps(patch)).decode()
    return {"uid": uid, "allowed": True, "patchType": "JSONPatch", "patch": encoded}


def denied(uid: str, message: str) -> JSON:
    return {
        "uid": uid,
        "allowed": False,
        "status": {"status": "Failure", "code": 400, "reason": "BadRequest", "message": message},
    }


def add_gate(spec: JSON, gate: str) -> list[JSON] | None:
    """JSON patch operations adding the scheduling gate `gate` to a pod spec (None: it has it).
    Raises BadReview when spec.schedulingGates is not a list."""
    gates = spec.get("schedulingGates")
    if gates is not None and not isinstance(gates, list):
        raise BadReview("spec.schedulingGates: expected a list")
    value = {"name": gate}
    if not gates:
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [value]}]
    if any(isinstance(g, dict) and g.get("name") == gate for g in gates):
        return None
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": value}]


# Counts an answered review: (route path, result), result one of RESULTS.
Count = Callable[[str, str], None]
RESULTS = ("allowed", "patched", "denied", "bad_request", "error")


def admission_app(
    routes: Mapping[str, Reviewer], *, count: Count | None = None, call: Call = answer_here
) -> web.Application:
    """One application serving every route (path -> reviewer); `count` hears each answer, `call`
    has the reviewer answer (by default right there, on the serving loop)."""
    app = web.Application(client_max_size=MAX_BODY)
    add_reviewers(app, routes, count=count, call=call)
    return app


def add_reviewers(
    app: web.Application,
    routes: Mapping[str, Reviewer],
    *,
    count: Count | None = None,
    call: Call = answer_here,
) -> None:
    """More routes on an admission application (the DRA gate beside the gang's)."""
    for path, reviewer in routes.items():
        app.router.add_post(path, _handler(path, reviewer, count or _uncounted, call))


def _uncounted(path: str, result: str) -> None:
    return None


def _result(response: JSON) -> str:
    if not response.get("allowed"):
        return "denied"
    return "patched" if response.get("patch") else "allowed"


def _handler(path: str, reviewer: Reviewer, count: Count, call: Call) -> Callable[[web.Request], Any]:
    async def mutate(request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            review = parse_review(loads(raw))
        except (ValueError, UnicodeDecodeError) as exc:  # BadReview is a ValueError
            log.warning("admission review refused: %s", exc)
            count(path, "bad_request")
            return web.Response(status=400, text=f"not an AdmissionReview: {exc}\n")
        try:
            response = await call(reviewer, review)
        except Exception:
            # The API server sees a 500 and applies the webhook's failurePolicy: counted, so
            # that an alert sees what the API server's own log would otherwise hide.
            count(path, "error")
            raise
        count(path, _result(response))
        warnings = pod_warnings(pod_create(review))
        if warnings:
            response = {**response, "warnings": warnings}
        body = {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
        return web.Response(text=dumps(body).decode(), content_type="application/json")

    return mutate
