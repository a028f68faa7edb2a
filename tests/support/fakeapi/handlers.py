"""The HTTP face: URL routing in the apiserver's grammar, query parsing, responses and watch streams."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from . import discovery, errors
from .deletion import DeleteOptions
from .faults import FaultSet, RecordedRequest
from .objects import encode
from .operations import Operations
from .reads import ListQuery, parse_resource_version
from .resources import ResourceType
from .selectors import SelectorError, parse_field_selector, parse_label_selector
from .watch import END_ABORTED, Watcher, WatchSettings, error_line

JsonObj = dict[str, Any]

_BOOL_TRUE = ("1", "t", "T", "true", "TRUE", "True")
_BOOL_FALSE = ("0", "f", "F", "false", "FALSE", "False")
_FLOWSCHEMA_UID = str(uuid.uuid4())
_PRIORITYLEVEL_UID = str(uuid.uuid4())
_NAMESPACE_SUBRESOURCES = ("status", "finalize")
_LOGGED = web.RequestKey("fakeapi.logged", bool)  # this request is already in the request log
# What the apiserver says when sendInitialEvents is asked of it on etcd 3.4 (recorded); this fake does not
# implement streaming lists either, so clients fall back to LIST+WATCH exactly as they did there.
_NO_WATCH_LIST = (
    "a watch stream was requested by the client "
    "but the required storage feature RequestWatchProgress is disabled"
)


@dataclass
class ServerState:
    """What the handlers share with the server object and its test hooks."""

    ops: Operations
    watch_settings: WatchSettings
    default_watch_timeout: float
    future_rv_wait: float
    wait_for_rv: Callable[[int, float], Awaitable[bool]]
    faults: FaultSet = field(default_factory=FaultSet)
    requests: list[RecordedRequest] = field(default_factory=list)
    watchers: set[Watcher] = field(default_factory=set)
    address: str = ""


@dataclass(frozen=True)
class Target:
    rt: ResourceType
    namespace: str
    name: str
    subresource: str


def make_app(state: ServerState) -> web.Application:
    app = web.Application()
    handler = _Handler(state)
    app.router.add_route("*", "/{tail:.*}", handler.handle)
    return app


def _headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {
        "Audit-Id": str(uuid.uuid4()),
        "Cache-Control": "no-cache, private",
        "Content-Type": "application/json",
        "X-Kubernetes-Pf-Flowschema-Uid": _FLOWSCHEMA_UID,
        "X-Kubernetes-Pf-Prioritylevel-Uid": _PRIORITYLEVEL_UID,
        **(extra or {}),
    }


def json_response(
    status: int, body: Any, *, sort_keys: bool = False, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(status=status, body=encode(body, sort_keys=sort_keys), headers=_headers(headers))


def error_response(error: errors.ApiError) -> web.Response:
    return json_response(error.code, error.status(), headers=error.headers)


class _Handler:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    @property
    def ops(self) -> Operations:
        return self.state.ops

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        raw = await request.read() if request.can_read_body else b""
        status = 0
        try:
            fault = self.state.faults.take(request.method, request.path, query)
            if fault is not None:
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                if fault.disconnect:
                    if request.transport is not None:
                        request.transport.abort()
                    return web.Response()  # never reaches the client: the connection is gone
                if fault.status is not None:
                    status = fault.status
                    return json_response(fault.status, fault.response_body(), headers=fault.headers)
            try:
                response = await self._route(request, query, raw)
            except errors.ApiError as exc:
                response = error_response(exc)
            status = response.status
            return response
        finally:
            if _LOGGED not in request:  # watches log themselves when their stream starts
                self._log(request, query, raw, status)

    def _log(self, request: web.Request, query: dict[str, str], raw: bytes, status: int) -> None:
        request[_LOGGED] = True
        content_type = request.headers.get("Content-Type", "")
        self.state.requests.append(
            RecordedRequest(request.method, request.path, query, content_type, _parsed(raw), status)
        )

    # -- routing -------------------------------------------------------------------------------------
    async def _route(self, request: web.Request, query: dict[str, str], raw: bytes) -> web.StreamResponse:
        content_type = request.headers.get("Content-Type", "")
        parts = [p for p in request.path.split("/") if p]
        method = request.method
        if parts in (["healthz"], ["readyz"], ["livez"]):
            return web.Response(text="ok", content_type="text/plain")
        if parts[:1] == ["version"] and len(parts) == 1:
            return json_response(200, discovery.VERSION_INFO)
        if parts == ["api"]:
            return json_response(200, discovery.core_versions(self.state.address))
        if parts == ["apis"]:
            return json_response(200, discovery.group_list(self.ops.types))
        if len(parts) == 2 and parts[0] == "apis":
            doc = discovery.group(self.ops.types, parts[1])
            if doc is None:
                raise errors.path_not_found()
            return json_response(200, doc)
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise errors.path_not_found()
        if not rest:
            doc = discovery.resource_list(self.ops.types, group, version)
            if doc is None or method != "GET":
                raise errors.path_not_found()
            return json_response(200, doc)
        target = self._target(group, version, rest)
        if not target.name:
            return await self._collection(request, target, method, query, raw)
        if target.subresource:
            return self._subresource(target, method, query, raw, content_type)
        return self._item(target, method, query, raw, content_type)

    def _target(self, group: str, version: str, rest: list[str]) -> Target:
        namespace = ""
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise errors.path_not_found()
        rt = self.ops.types.lookup(group, version, rest[0])
        if rt is None or (namespace and not rt.namespaced):
            raise errors.path_not_found()
        name = rest[1] if len(rest) > 1 else ""
        if name and rt.namespaced and not namespace:
            raise errors.path_not_found()
        subresource = rest[2] if len(rest) > 2 else ""
        if subresource and subresource not in rt.subresources:
            raise errors.path_not_found()
        return Target(rt, namespace, name, subresource)

    async def _collection(
        self, request: web.Request, target: Target, method: str, query: dict[str, str], raw: bytes
    ) -> web.StreamResponse:
        rt, namespace = target.rt, target.namespace
        if method == "GET":
            list_query = self._list_query(rt, query)
            if query.get("watch") and _parse_bool(query, "watch"):
                return await self._watch(request, rt, namespace, list_query, query)
            await self._wait_for_resource_version(list_query.resource_version, query)
            return self._respond(rt, 200, self.ops.list(rt, namespace, list_query))
        if method == "POST":
            if rt.namespaced and not namespace:
                raise errors.method_not_allowed()
            _refuse_dry_run(query)
            return self._respond(rt, 201, self.ops.create(rt, namespace, _json_body(raw)))
        if method == "DELETE":
            _refuse_dry_run(query)
            result = self.ops.delete_collection(
                rt, namespace, self._list_query(rt, query), _delete_options(query, raw)
            )
            return self._respond(rt, 200, result)
        raise errors.method_not_allowed()

    def _item(
        self, target: Target, method: str, query: dict[str, str], raw: bytes, content_type: str
    ) -> web.Response:
        rt, namespace, name = target.rt, target.namespace, target.name
        if method == "GET":
            return self._respond(rt, 200, self.ops.get(rt, namespace, name))
        _refuse_dry_run(query)
        if method == "PUT":
            existed = self.ops.store.get(rt.storage_key, namespace, name) is not None
            result = self.ops.replace(rt, namespace, name, _json_body(raw))
            return self._respond(rt, 200 if existed else 201, result)
        if method == "PATCH":
            return self._respond(rt, 200, self.ops.patch(rt, namespace, name, content_type, raw))
        if method == "DELETE":
            result = self.ops.delete(rt, namespace, name, _delete_options(query, raw))
            return self._respond(rt, 200, result)
        raise errors.method_not_allowed()

    def _subresource(
        self, target: Target, method: str, query: dict[str, str], raw: bytes, content_type: str
    ) -> web.Response:
        rt, namespace, name, sub = target.rt, target.namespace, target.name, target.subresource
        if sub == "binding":
            if method != "POST":
                raise errors.method_not_allowed()
            _refuse_dry_run(query)
            return json_response(201, self.ops.bind(namespace, name, _json_body(raw)))
        if sub == "eviction":
            if method != "POST":
                raise errors.method_not_allowed()
            _refuse_dry_run(query)
            return json_response(201, self.ops.evict(namespace, name, _json_body(raw)))
        if method == "GET":
            return self._respond(rt, 200, self.ops.get(rt, namespace, name))
        _refuse_dry_run(query)
        if method == "PUT":
            return self._respond(rt, 200, self.ops.replace(rt, namespace, name, _json_body(raw), sub))
        if method == "PATCH":
            return self._respond(rt, 200, self.ops.patch(rt, namespace, name, content_type, raw, sub))
        raise errors.method_not_allowed()

    def _respond(self, rt: ResourceType, status: int, body: JsonObj) -> web.Response:
        return json_response(status, body, sort_keys=rt.custom and body.get("kind") != "Status")

    # -- list and watch ------------------------------------------------------------------------------
    def _list_query(self, rt: ResourceType, query: dict[str, str]) -> ListQuery:
        try:
            labels = parse_label_selector(query.get("labelSelector", ""))
            fields = parse_field_selector(query.get("fieldSelector", ""))
            fields.check_supported(self.ops.storage_type(rt).field_getters)
        except SelectorError as exc:
            raise errors.bad_request(str(exc)) from exc
        return ListQuery(
            labels=labels,
            fields=fields,
            resource_version=query.get("resourceVersion", ""),
            resource_version_match=query.get("resourceVersionMatch", ""),
            limit=_parse_int(query, "limit", 0),
            continue_token=query.get("continue", ""),
        )

    async def _wait_for_resource_version(self, resource_version: str, query: dict[str, str]) -> None:
        """A resourceVersion newer than the store: wait a while for it, then 504 like the apiserver."""
        if resource_version in ("", "0"):
            return
        wanted = parse_resource_version(resource_version)
        if wanted <= self.ops.store.rv:
            return
        wait = self.state.future_rv_wait
        if "timeoutSeconds" in query:
            wait = min(wait, float(_parse_int(query, "timeoutSeconds", 0)))
        if not await self.state.wait_for_rv(wanted, wait):
            raise errors.too_large_resource_version(wanted, self.ops.store.rv)

    async def _watch(
        self,
        request: web.Request,
        rt: ResourceType,
        namespace: str,
        list_query: ListQuery,
        query: dict[str, str],
    ) -> web.StreamResponse:
        bookmarks = _parse_bool(query, "allowWatchBookmarks") if "allowWatchBookmarks" in query else False
        timeout = float(_parse_int(query, "timeoutSeconds", 0)) or self.state.default_watch_timeout
        response = web.StreamResponse(status=200, headers=_headers())
        response.enable_chunked_encoding()
        await response.prepare(request)
        self._log(request, query, b"", 200)

        async def write(line: bytes) -> None:
            await response.write(line)

        if "sendInitialEvents" in query and _parse_bool(query, "sendInitialEvents"):
            await write(error_line(errors.ApiError(500, "InternalError", _NO_WATCH_LIST)))
            await response.write_eof()
            return response
        watcher = Watcher(
            self.ops, rt, namespace, list_query, bookmarks=bookmarks, settings=self.state.watch_settings
        )
        try:
            await self._wait_for_resource_version(list_query.resource_version, query)
            watcher.begin(list_query.resource_version)
        except errors.ApiError as exc:
            await write(error_line(exc))
            await response.write_eof()
            return response
        self.state.watchers.add(watcher)
        try:
            ended = await watcher.run(write, timeout)
        finally:
            watcher.close()
            self.state.watchers.discard(watcher)
        if ended == END_ABORTED:
            if request.transport is not None:
                request.transport.abort()
            return response
        await response.write_eof()
        return response


def _parsed(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise errors.bad_request(f"couldn't get version/kind; json parse error: {exc}") from exc


def _parse_bool(query: dict[str, str], name: str) -> bool:
    value = query.get(name, "")
    if value in _BOOL_TRUE:
        return True
    if value in _BOOL_FALSE:
        return False
    raise errors.bad_request(f'strconv.ParseBool: parsing "{value}": invalid syntax (query parameter {name})')


def _parse_int(query: dict[str, str], name: str, default: int) -> int:
    if name not in query or query[name] == "":
        return default
    try:
        return int(query[name])
    except ValueError as exc:
        raise errors.bad_request(
            f'strconv.ParseInt: parsing "{query[name]}": invalid syntax (query parameter {name})'
        ) from exc


def _refuse_dry_run(query: dict[str, str]) -> None:
    if query.get("dryRun"):
        raise errors.bad_request("the fake API server does not implement dryRun")


def _delete_options(query: dict[str, str], raw: bytes) -> DeleteOptions:
    body = _json_body(raw) if raw.strip() else {}
    if not isinstance(body, dict):
        raise errors.bad_request("DeleteOptions must be a JSON object")
    if body.get("dryRun") or query.get("dryRun"):
        raise errors.bad_request("the fake API server does not implement dryRun")
    grace = body.get("gracePeriodSeconds")
    if grace is None and "gracePeriodSeconds" in query:
        grace = _parse_int(query, "gracePeriodSeconds", 0)
    preconditions = body.get("preconditions") or {}
    return DeleteOptions(
        grace_period=None if grace is None else int(grace),
        uid=preconditions.get("uid"),
        resource_version=preconditions.get("resourceVersion"),
    )
