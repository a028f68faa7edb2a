"""POST <prefix>/prioritize: ExtenderArgs -> HostPriorityList, one entry per offered node, 0-10.

Nodes the cache does not know and pods without device requests score 0 everywhere: the
extender then leaves the ranking to kube-scheduler's own plugins.
"""

from __future__ import annotations

import json
import re
from collections.abc import Container
from typing import TYPE_CHECKING

from aiohttp import web

from allocator.service.handlers.common import BadRequest, bad_request, json_reply, parse_body
from apis.extender import MAX_PRIORITY, ExtenderArgs

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
        scores: dict[str, int] = {}
        result = "invalid_request" if req.invalid is not None else "no_devices"
    else:
        scores = svc.cache.score(req, names)
        if svc.gang is not None:  # planned gang members, sibling affinity
            scores = svc.gang.steering.prioritize(req, names, scores)
        result = "ok"
    return json_reply(request, host_priority_list(names, scores, svc.cache.nodes), result)


_PLAIN_NAME = re.compile(r"[a-z0-9][a-z0-9.\-]*")  # DNS-1123: needs no JSON escaping
_SCORE_TAIL = [f"{score}}}" for score in range(MAX_PRIORITY + 1)]  # '0}' .. '10}'
_HOST_HEAD: dict[str, str] = {}  # node name -> '{"Host":"<name>","Score":'


def host_priority_list(names: list[str], scores: dict[str, int], known: Container[str] = ()) -> str:
    """`[{"Host":…,"Score":…},…]` for every name, scores clamped to 0..10.

    Written by hand from cached pieces: json.dumps of thousands of small dicts costs as much as
    the scoring. Names of `known` nodes came from the API server, which only accepts DNS-1123
    names, and need no escaping."""
    heads = _HOST_HEAD
    if len(heads) > 100_000:
        heads.clear()
    parts = []
    for name in names:
        head = heads.get(name)
        if head is None:
            plain = name in known or _PLAIN_NAME.fullmatch(name)
            head = '{"Host":' + (f'"{name}"' if plain else json.dumps(name)) + ',"Score":'
            if plain:
                heads[name] = head
        score = scores.get(name, 0)
        if not 0 <= score <= MAX_PRIORITY:
            score = 0 if score < 0 else MAX_PRIORITY
        parts.append(head + _SCORE_TAIL[int(score)])
    return "[" + ",".join(parts) + "]"
