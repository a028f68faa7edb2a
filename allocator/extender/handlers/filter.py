"""POST <prefix>/filter: ExtenderArgs -> ExtenderFilterResult.

The reply's shape follows the request's (wire fact 6): NodeNames in, NodeNames out (`Nodes` null);
a NodeList in, the passing NodeList items out, unchanged and in the order given (`NodeNames` null,
which kube-scheduler would otherwise drop silently when nodeCacheCapable is false). Every offered
node is either passed or listed with a reason; a reason the core marks unresolvable goes to
FailedAndUnresolvableNodes, so kube-scheduler does not try preemption for it.

With `roundTrips: 1` (docs/service.md, "Round trips") a pod with devices passes one node only, the
one prioritize would have scored 10 (the core's ranking, then the gang's adjustment): kube-scheduler
places a pod that passes one node without scoring it and so never calls prioritize. The other
nodes that fit are left out of the reply rather than listed as failed: kube-scheduler reads the
failure maps only when no node passes, and they would only lengthen the reply.

Pods that request no device (managedResources can still send them, and an extender configured
without managedResources sees every pod) pass every offered node: the allocator has nothing to
add to kube-scheduler's own checks.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from allocator.extender.handlers.common import BadRequest, bad_request, json_reply, parse_body
from allocator.extender.handlers.notices import NOTICES
from allocator.extender.handlers.service_view import ServiceView
from allocator.runtime.coreadapter import PodRequest
from allocator.runtime.decide import best_of, verdicts_for, why_not
from apis.extender import ExtenderArgs

JSON = dict[str, Any]


async def handle(request: web.Request, svc: ServiceView) -> web.Response:
    try:
        args = await parse_body(request, ExtenderArgs.from_dict)
    except BadRequest as exc:
        return bad_request(request, str(exc))
    names = args.names()
    req = svc.core.request(args.pod)
    notices = request.app.get(NOTICES)
    if req.warnings and notices is not None:
        notices.tell(svc.events, args.pod, req)
    # A gang member's verdict comes from its gang's plan, a room owner's from its room (the
    # components' steering), else the core's (allocator/runtime/decide.py).
    decision = verdicts_for(svc.core, svc.steering, args.pod, req, names)
    verdicts, result = decision.verdicts, decision.result
    passed, failed, unresolvable = verdicts.passed, verdicts.failed, verdicts.unresolvable
    if svc.round_trips == 1 and result == "ok" and len(passed) > 1:
        passed = [best_of(svc.core, svc.steering, args.pod, req, passed)]
    for code, count in verdicts.codes.items():
        svc.metrics.node_rejections.labels(code).inc(count)
    if not passed and names and not decision.steered:  # the gang controller explains a held member
        _event(svc, args, req, failed, unresolvable)
    if args.node_names is not None:
        nodes_out, names_out = None, passed
    else:
        keep = set(passed)
        items = (args.nodes or {}).get("items") or []
        nodes_out = {"metadata": {}, "items": [n for n in items if n["metadata"]["name"] in keep]}
        names_out = None
    payload = {
        "Nodes": nodes_out,
        "NodeNames": names_out,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }
    return json_reply(request, payload, result)


def _event(
    svc: ServiceView,
    args: ExtenderArgs,
    req: PodRequest,
    failed: dict[str, str],
    unresolvable: dict[str, str],
) -> None:
    """One Event per pod attempt that fits nowhere (allocator/runtime/decide.py `why_not`)."""
    note = why_not(svc.core, req, {**failed, **unresolvable})
    svc.events.warn(args.pod, "FailedDeviceAllocation", "Scheduling", note)
