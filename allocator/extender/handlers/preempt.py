"""POST <prefix>/preempt: ExtenderPreemptionArgs -> ExtenderPreemptionResult.

kube-scheduler asks after its own dry run picked victims per candidate node by counting
resources. For each such node we answer with the cheapest lower-priority victims that really
make room for the pod's devices there (`CoreAdapter.preemption_victims`: the real device
choice on a copy of the node without them, so the freed GPUs sit in the right NVLink domain or
PCIe switch, beside a free NIC for a joint request), and leave out nodes where no set does. A
member of a running gang is named only together with its whole gang, so only when the whole gang
runs on that node. Gang members never preempt here: their gang controller makes room for the whole
gang at once (a gated member never reaches kube-scheduler at all). A pod without device requests
gets kube-scheduler's own choice back.

Victims are chosen around PodDisruptionBudgets (the watch cache keeps them: protected pods are the
last resort, allocator/core/gang/victims.py), and each node's count of violations is of the
victims we name (kube-scheduler prefers the node with the fewest).
"""

from __future__ import annotations

from aiohttp import web

from allocator.core.gang.victims import violations
from allocator.extender.handlers.common import BadRequest, bad_request, json_reply, parse_body
from allocator.extender.handlers.service_view import ServiceView
from allocator.runtime.cache.victims import candidates_near
from apis.extender import ExtenderPreemptionArgs, ExtenderPreemptionResult, MetaVictims


async def handle(request: web.Request, svc: ServiceView) -> web.Response:
    try:
        args = await parse_body(request, ExtenderPreemptionArgs.from_dict)
    except BadRequest as exc:
        return bad_request(request, str(exc))
    req = svc.core.request(args.pod)
    if req.invalid is not None:
        return json_reply(request, ExtenderPreemptionResult().to_dict(), "invalid_request")
    if req.gang is not None:
        return json_reply(request, ExtenderPreemptionResult().to_dict(), "gang")
    if not req.wants_devices:
        return json_reply(request, ExtenderPreemptionResult(args.victims).to_dict(), "no_devices")
    cache = svc.cache
    pool = candidates_near(cache.pods, cache.ledger.holds, args.victims, cache.budgets)
    # Nodes where no set makes room (or it fits already: the filter will say so) are left out.
    kept: dict[str, MetaVictims] = {}
    for node, victims in svc.core.preemption_victims(req, args.victims, pool).items():
        kept[node] = MetaVictims([v.uid for v in victims], violations(victims))
        svc.metrics.preemption_victims.labels("extender").inc(len(victims))
    svc.metrics.preemption_nodes.labels("kept").inc(len(kept))
    svc.metrics.preemption_nodes.labels("dropped").inc(len(args.victims) - len(kept))
    return json_reply(request, ExtenderPreemptionResult(kept).to_dict(), "ok" if kept else "no_fit")
