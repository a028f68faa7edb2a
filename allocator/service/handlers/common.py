"""Request parsing and replies shared by the verbs.

Bad input is the client's problem and gets a 400 with the reason (kube-scheduler never reads a
non-200 body, wire fact 1, but a person with curl does). A 500 only ever means a bug here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from apis.errors import CodecError

T = TypeVar("T")

RESULT = web.RequestKey("topoalloc.result", str)  # the metric label of the outcome


class BadRequest(Exception):
    pass


async def parse_body(request: web.Request, decode: Callable[[Any], T]) -> T:
    raw = await request.read()
    if not raw:
        raise BadRequest("empty request body")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not JSON: {exc}") from None
    try:
        return decode(data)
    except CodecError as exc:
        raise BadRequest(str(exc)) from None
    except (KeyError, TypeError, AttributeError) as exc:  # a shape the codec did not foresee
        raise BadRequest(f"malformed request: {exc!r}") from None


def json_reply(request: web.Request, payload: Any, result: str = "ok") -> web.Response:
    request[RESULT] = result
    text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return web.Response(text=text, content_type="application/json")


def bad_request(request: web.Request, message: str) -> web.Response:
    request[RESULT] = "bad_request"
    return web.Response(status=400, text=message + "\n", content_type="text/plain")
