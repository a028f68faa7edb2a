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

from collections import Counter
from typing import Any

import numpy as np
from aiohttp import web

from allocator.extender.handlers.common import BadRequest, bad_request, json_reply, parse_body
from allocator.extender.handlers.notices import NOTICES
from allocator.extender.handlers.service_view import ServiceView
from allocator.runtime.coreadapter import FilterVerdicts, PodRequest
from apis.extender import MAX_PRIORITY, ExtenderArgs

JSON = dict[str, Any]

# At most this many distinct reasons in one Event note.
EVENT_REASONS = 3


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
    # A gang member's verdict comes from its gang's plan, a room owner's from its room
    # (the components' steering, allocator/runtime/steering.py).
    steered = svc.steering.filter(args.pod, req, names)
    if req.invalid is not None:
        verdicts = FilterVerdicts([], unresolvable=dict.fromkeys(names, req.invalid.message))
        verdicts.codes[req.invalid.code] = len(names)
        result = "invalid_request"
    elif steered is None and not req.wants_devices:
        verdicts, result = FilterVerdicts(names), "no_devices"
    else:
        # Else the columns' answer, no per-node Python (docs/service.md, performance).
        verdicts = steered if steered is not None else svc.core.filter_nodes(req, names)
        result = "ok" if verdicts.passed else "no_fit"
    passed, failed, unresolvable = verdicts.passed, verdicts.failed, verdicts.unresolvable
    if svc.round_trips == 1 and result == "ok" and len(passed) > 1:
        passed = best_only(svc, args.pod, req, passed)
    for code, count in verdicts.codes.items():
        svc.metrics.node_rejections.labels(code).inc(count)
    if not passed and names and steered is None:  # the gang controller explains a held member
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


def best_only(svc: ServiceView, pod: JSON, req: PodRequest, passed: list[str]) -> list[str]:
    """The node prioritize would rank first among `passed`, alone: the steering's scores (a gang's
    planned member and sibling affinity, a room owner's first room) where it has them, the core's
    ranking among their equals."""
    scores = svc.core.score_nodes(req, passed)
    steered = svc.steering.scores(pod, req, passed, scores)
    if steered is not None:
        scores = np.asarray(steered, np.int64) * (MAX_PRIORITY + 1) + scores
    return [passed[int(np.argmax(scores))]]


def _event(
    svc: ServiceView,
    args: ExtenderArgs,
    req: PodRequest,
    failed: dict[str, str],
    unresolvable: dict[str, str],
) -> None:
    """One Event per pod attempt that fits nowhere, summarising the reasons by count. The reasons
    are the stable messages kube-scheduler aggregates; the Event adds, per reason, what one such
    node has left (the rejection's detail), which the reply itself never carries."""
    rejected = {**failed, **unresolvable}
    counts = Counter(rejected.values())
    example = {}
    for name, msg in rejected.items():
        example.setdefault(msg, name)
    parts = []
    for msg, n in counts.most_common(EVENT_REASONS):
        node = example[msg]
        rejection = svc.core.node_rejection(req, node)
        detail = rejection.detail if rejection is not None and rejection.message == msg else ""
        parts.append(f"{n} {msg}" + (f" (e.g. {node}: {detail})" if detail else ""))
    more = len(counts) - EVENT_REASONS
    note = f"0/{len(rejected)} nodes can host the pod's devices: {'; '.join(parts)}" + (
        f"; and {more} other reasons" if more > 0 else ""
    )
    svc.events.warn(args.pod, "FailedDeviceAllocation", "Scheduling", note)
