"""POST <prefix>/bind: ExtenderBindingArgs -> ExtenderBindingResult.

A failure is an `Error` string in a 200 reply, which kube-scheduler turns into a
FailedScheduling event and a retry (wire fact 7); only a body that is not an
ExtenderBindingArgs gets a 400.
"""

from __future__ import annotations

from aiohttp import web

from allocator.extender.handlers.common import BadRequest, bad_request, json_reply, parse_body
from allocator.extender.handlers.service_view import ServiceView
from apis.extender import ExtenderBindingArgs


async def handle(request: web.Request, svc: ServiceView) -> web.Response:
    try:
        args = await parse_body(request, ExtenderBindingArgs.from_dict)
    except BadRequest as exc:
        return bad_request(request, str(exc))
    outcome = await svc.binder.bind(args)
    response = json_reply(request, {"Error": outcome.error}, outcome.reason)
    if outcome.reason == "not_leader":
        # kube-scheduler keeps its connection alive, and a leader-only Service only routes new
        # connections: after leadership moved, every retry on that connection would reach this
        # standby again (the real-cluster tier saw binds fail for minutes). Closing it makes the
        # retry open a new one, which reaches the leader.
        response.force_close()
    return response
