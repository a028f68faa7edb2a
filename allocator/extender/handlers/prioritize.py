"""POST <prefix>/prioritize: ExtenderArgs -> HostPriorityList, one entry per offered node, 0-10.

Nodes the cache does not know and pods without device requests score 0 everywhere: the
extender then leaves the ranking to kube-scheduler's own plugins.

The scores come from the core as an array aligned with the names and the reply is joined from
cached per-node pieces: no per-node Python on the request path (docs/service.md, performance).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from operator import add

import numpy as np
from aiohttp import web

from allocator.extender.handlers.common import BadRequest, bad_request, json_reply, parse_body
from allocator.extender.handlers.service_view import ServiceView
from apis.extender import MAX_PRIORITY, ExtenderArgs


async def handle(request: web.Request, svc: ServiceView) -> web.Response:
    try:
        args = await parse_body(request, ExtenderArgs.from_dict)
    except BadRequest as exc:
        return bad_request(request, str(exc))
    names = args.names()
    req = svc.core.request(args.pod)
    scores: Sequence[int] | np.ndarray
    if req.invalid is not None or not req.wants_devices:
        scores = np.zeros(len(names), np.int64)
        result = "invalid_request" if req.invalid is not None else "no_devices"
    else:
        scores = svc.core.score_nodes(req, names)
        # planned members and siblings, a room's owner (its room's node first)
        steered = svc.steering.scores(args.pod, req, names, scores)
        scores = steered if steered is not None else scores
        result = "ok"
    return json_reply(request, host_priority_list(names, scores), result)


_SCORE_TAIL = [f"{score}}}".encode() for score in range(MAX_PRIORITY + 1)]  # b'0}' .. b'10}'
_HOST_HEAD: dict[str, bytes] = {}  # node name -> b'{"Host":"<name>","Score":'
_HEADS_KEPT = 100_000  # more distinct names than any cluster has nodes: forget them all


def host_priority_list(names: Sequence[str], scores: Sequence[int] | np.ndarray) -> bytes:
    """`[{"Host":…,"Score":…},…]`, one entry per name with the score at the same position,
    clamped to 0..10; the bytes `json.dumps` writes.

    Joined from cached pieces by C-level maps: json.dumps of thousands of small dicts costs as
    much as the scoring, and so does a Python loop over the names."""
    if isinstance(scores, np.ndarray):
        clamped = np.clip(scores, 0, MAX_PRIORITY).tolist()
    else:
        clamped = [min(MAX_PRIORITY, max(0, int(s))) for s in scores]
    heads = _HOST_HEAD
    try:
        parts = map(add, map(heads.__getitem__, names), map(_SCORE_TAIL.__getitem__, clamped))
        return b"[" + b",".join(parts) + b"]"
    except KeyError:  # names never answered before
        if len(heads) > _HEADS_KEPT:
            heads.clear()
        for name in names:
            if name not in heads:
                heads[name] = b'{"Host":' + json.dumps(name).encode() + b',"Score":'
        parts = map(add, map(heads.__getitem__, names), map(_SCORE_TAIL.__getitem__, clamped))
        return b"[" + b",".join(parts) + b"]"
