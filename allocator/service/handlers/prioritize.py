"""POST <prefix>/prioritize: ExtenderArgs -> HostPriorityList, one entry per offered node, 0-10.

Nodes the cache does not know and pods without device requests score 0 everywhere: the
extender then leaves the ranking to kube-scheduler's own plugins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from allocator.service.handlers.common import BadRequest, bad_request, json_reply, parse_body
from apis.extender import ExtenderArgs

if TYPE_CHECKING:
    from allocator.service.server import Allocator


async def handle(request: web.Request, svc: Allocator) -> web.Response:
    try:
        args = await parse_body(request, ExtenderArgs.from_dict)
    except BadRequest as exc:
        return bad_request(request, str(exc))
    names = args.names()
    req = svc.core.request(args.pod)
    if req.invalid is not None or not req.wants_devices:
        scores = dict.fromkeys(names, 0)
        result = "invalid_request" if req.invalid is not None else "no_devices"
    else:
        scores = svc.cache.score(req, names)
        result = "ok"
    return json_reply(request, [{"Host": n, "Score": scores[n]} for n in names], result)
