"""Request parsing and replies shared by the verbs.

Bad input is the client's problem and gets a 400 with the reason (kube-scheduler never reads a
non-200 body, wire fact 1, but a person with curl does). A 500 only ever means a bug here.

Bodies are decoded and encoded with orjson: a 5,000-node filter reply costs ~1 ms in the standard
library's encoder and ~0.1 ms in orjson. Both fall back to the standard library wherever the two
could differ, so what is accepted and the bytes written stay those of `json`. The exceptions are
numbers no Kubernetes object holds (its API has no float fields, and Go writes no NaN): a float is
written in orjson's shortest form (`1e-7` where `json` wrote `1e-07`, the same value), NaN and
Infinity (accepted through the fallback) as null, and an integer beyond 64 bits decodes as a float.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
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
        data = loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not JSON: {exc}") from None
    except RecursionError:  # beyond orjson's depth limit, `json` recurses per level
        raise BadRequest("request body is not JSON: nested too deeply") from None
    try:
        return decode(data)
    except CodecError as exc:
        raise BadRequest(str(exc)) from None
    except (KeyError, TypeError, AttributeError) as exc:  # a shape the codec did not foresee
        raise BadRequest(f"malformed request: {exc!r}") from None


def loads(raw: bytes) -> Any:
    """`json.loads`, fast. orjson refuses what strict JSON refuses (NaN, lone surrogates, UTF-16);
    `json` then decides, so a body is accepted exactly when it was before."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _as_go_decodes(json.loads(raw))


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _as_go_decodes(value: Any) -> Any:
    """Strings as Go's encoding/json decodes them: an escaped lone surrogate (`"\\ud800"`, which
    no UTF-8 text can hold) becomes U+FFFD. Left alone, it broke the first thing that encoded it,
    such as the pod's URL in a bind (found by bench/fuzz.py)."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_as_go_decodes(v) for v in value]
    if isinstance(value, dict):
        return {_as_go_decodes(k): _as_go_decodes(v) for k, v in value.items()}
    return value


def dumps(payload: Any) -> bytes:
    """`json.dumps(payload, separators=(",", ":")).encode()`, fast, byte for byte: orjson writes
    non-ASCII text and DEL raw where `json` escapes them, and refuses ints beyond 64 bits and
    non-string keys, so those few payloads go to `json`."""
    try:
        out = orjson.dumps(payload)
    except TypeError:  # orjson.JSONEncodeError
        out = b""
    if out and out.isascii() and b"\x7f" not in out:  # json escapes DEL too
        return out
    return json.dumps(payload, separators=(",", ":")).encode()


def json_reply(request: web.Request, payload: Any, result: str = "ok") -> web.Response:
    """A 200 with `payload` as JSON (a str or bytes payload is already JSON)."""
    request[RESULT] = result
    if isinstance(payload, str):
        body = payload.encode()
    elif isinstance(payload, bytes):
        body = payload
    else:
        body = dumps(payload)
    return web.Response(body=body, content_type="application/json", charset="utf-8")


def bad_request(request: web.Request, message: str) -> web.Response:
    request[RESULT] = "bad_request"
    return web.Response(status=400, text=message + "\n", content_type="text/plain")
