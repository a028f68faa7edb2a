"""`FakeApiServer`: the aiohttp server on 127.0.0.1, its lifecycle, and the hooks tests drive it with.

All state lives on the event loop the server was started on. Every public hook may be called from that
loop or from any other thread: calls from elsewhere are run on the server's loop and waited for, so a test
that runs the server in a background thread (`ServerThread`) uses the same API as an async test.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import threading
import time
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from aiohttp import web

from . import clients
from .builtin import builtin_registry, custom_resource_type
from .faults import Fault, RecordedRequest
from .handlers import ServerState, make_app
from .objects import SERVER_MANAGED, canonical_metadata, new_uid, timestamp
from .operations import Operations
from .resources import ResourceType
from .store import Change, Store
from .watch import END_ABORTED, END_BROKEN, END_SHUTDOWN, WatchSettings

JsonObj = dict[str, Any]
P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_CROSS_THREAD_TIMEOUT = 30.0


def on_server_loop(
    method: Callable[Concatenate[FakeApiServer, P], R],
) -> Callable[Concatenate[FakeApiServer, P], R]:
    """Run a hook on the server's loop when called from another thread, and wait for its result."""

    @functools.wraps(method)
    def wrapper(self: FakeApiServer, *args: P.args, **kwargs: P.kwargs) -> R:
        loop = self._loop
        if loop is None or not loop.is_running() or threading.get_ident() == self._loop_thread:
            return method(self, *args, **kwargs)

        async def call() -> R:
            return method(self, *args, **kwargs)

        return asyncio.run_coroutine_threadsafe(call(), loop).result(_CROSS_THREAD_TIMEOUT)

    return wrapper


class FakeApiServer:
    """A stateful Kubernetes API server for tests, speaking the real REST protocol over HTTP.

    Timing knobs (seconds) default to the real apiserver's values; test fixtures shorten them.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        bookmark_interval: float = 60.0,
        bookmark_before_timeout: float = 2.0,
        default_watch_timeout: float = 1800.0,
        future_rv_wait: float = 3.0,
        history_limit: int = 10_000,
        watch_queue_limit: int = 10_000,
        require_namespaces: bool = True,
        namespaces: tuple[str, ...] = DEFAULT_NAMESPACES,
    ) -> None:
        self.host = host
        self.port = port
        self.types = builtin_registry()
        self.store = Store(history_limit)
        self.ops = Operations(self.types, self.store, require_namespaces=require_namespaces)
        self._rv_moved = asyncio.Event()
        self.store.subscribe(self._on_change)
        self._state = ServerState(
            ops=self.ops,
            watch_settings=WatchSettings(bookmark_interval, bookmark_before_timeout, watch_queue_limit),
            default_watch_timeout=default_watch_timeout,
            future_rv_wait=future_rv_wait,
            wait_for_rv=self._wait_for_rv,
        )
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        for name in namespaces:
            self.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # -- lifecycle -----------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        # handler_cancellation: a watch whose client went away stops at once instead of at its next write.
        self._runner = web.AppRunner(
            make_app(self._state), handler_cancellation=True, access_log=None, shutdown_timeout=2.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._state.address = f"{self.host}:{self.port}"

    async def close(self) -> None:
        for watcher in list(self._state.watchers):
            watcher.stop(END_SHUTDOWN)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- resource types ------------------------------------------------------------------------------
    @on_server_loop
    def register_crd(
        self,
        group: str,
        version: str,
        plural: str,
        kind: str,
        *,
        namespaced: bool,
        singular: str = "",
        short_names: tuple[str, ...] = (),
        status_subresource: bool = True,
        selectable_fields: tuple[str, ...] = (),
    ) -> ResourceType:
        """Serve a custom resource, as if its CRD had been created (and is established)."""
        rt = custom_resource_type(
            group, version, plural, kind,
            namespaced=namespaced, singular=singular, short_names=short_names,
            status_subresource=status_subresource, selectable_fields=selectable_fields,
        )  # fmt: skip
        self.types.add(rt)
        return rt

    @on_server_loop
    def serve(self, *types: ResourceType) -> None:
        """Serve built-in resource types a fresh fake does not (an alpha API turned on:
        builtin.native_gang_types)."""
        for rt in types:
            self.types.add(rt)

    # -- direct object access (no HTTP, no validation) -----------------------------------------------
    @on_server_loop
    def get(self, resource: str, name: str, namespace: str = "") -> JsonObj | None:
        """A copy of a stored object, by resource name (`pods`, `devices`, `leases`...), or None."""
        rt = self.types.resolve(resource)
        obj = self.store.get(rt.storage_key, namespace if rt.namespaced else "", name)
        return copy.deepcopy(obj) if obj is not None else None

    @on_server_loop
    def list_objects(self, resource: str, namespace: str | None = None) -> list[JsonObj]:
        """Copies of the stored objects of one resource, in (namespace, name) order."""
        rt = self.types.resolve(resource)
        return copy.deepcopy(self.store.list(rt.storage_key, namespace))

    @on_server_loop
    def put(self, obj: JsonObj) -> JsonObj:
        """Store `obj` (its apiVersion and kind pick the resource), creating or replacing it, and notify
        watchers. It fills uid/creationTimestamp/resourceVersion and the kind's create-time defaults but
        keeps a `status` the caller gave: this seeds state, it is not an API request."""
        rt = self.types.by_kind(obj["apiVersion"], obj["kind"])
        srt = self.ops.storage_type(rt)
        stored = srt.stamp(rt.view.from_view(copy.deepcopy(obj)) if rt.view else copy.deepcopy(obj))
        meta = stored.setdefault("metadata", {})
        if srt.namespaced:
            meta.setdefault("namespace", "default")
        else:
            meta.pop("namespace", None)
        existing = self.store.get(srt.key, meta.get("namespace", ""), meta["name"])
        if existing is None:
            for managed in SERVER_MANAGED:
                meta.pop(managed, None)
            now = timestamp()
            meta["uid"] = new_uid()
            meta["creationTimestamp"] = now
            if srt.tracks_generation:
                meta["generation"] = 1
            given_status = stored.get("status")
            srt.behaviour.prepare_create(stored, now)
            if given_status is not None:
                stored["status"] = given_status
        else:
            for managed in ("uid", "creationTimestamp", "generation"):
                if managed in existing["metadata"]:
                    meta[managed] = existing["metadata"][managed]
        srt.behaviour.canonicalise(stored)
        stored["metadata"] = canonical_metadata(meta)
        result = self.store.add(srt.key, stored) if existing is None else self.store.replace(srt.key, stored)
        return copy.deepcopy(result)

    @on_server_loop
    def remove(self, resource: str, name: str, namespace: str = "") -> JsonObj | None:
        """Remove an object at once (a DELETED event), ignoring finalizers and grace periods."""
        rt = self.types.resolve(resource)
        namespace = namespace if rt.namespaced else ""
        if self.store.get(rt.storage_key, namespace, name) is None:
            return None
        return copy.deepcopy(self.store.remove(rt.storage_key, namespace, name))

    @property
    def resource_version(self) -> str:
        """The newest resourceVersion (the one a LIST would report)."""
        return str(self.store.rv)

    # -- failure hooks -------------------------------------------------------------------------------
    @on_server_loop
    def compact(self) -> None:
        """Drop the change history: any resume (WATCH or exact LIST) from an earlier RV gets 410."""
        self.store.compact()

    @on_server_loop
    def break_watches(self, *, abort: bool = False) -> int:
        """End every open watch: cleanly (the stream just ends) or, with `abort`, by dropping the TCP
        connection. Returns how many watches were open."""
        watchers = list(self._state.watchers)
        for watcher in watchers:
            watcher.stop(END_ABORTED if abort else END_BROKEN)
        return len(watchers)

    @on_server_loop
    def inject_fault(
        self,
        method: str | None = None,
        path: str | None = None,
        *,
        watch: bool | None = None,
        status: int | None = None,
        body: Any = None,
        message: str = "",
        reason: str = "",
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
        times: int | None = 1,
        disconnect: bool = False,
    ) -> Fault:
        """Make the next `times` requests matching `method`/`path` (regex)/`watch` fail or stall.
        See `Fault`; the returned object counts its `hits`."""
        fault = Fault(
            method=method, path=path, watch=watch, status=status, body=body, message=message, reason=reason,
            headers=dict(headers or {}), delay=delay, times=times, disconnect=disconnect,
        )  # fmt: skip
        return self._state.faults.add(fault)

    @on_server_loop
    def clear_faults(self) -> None:
        self._state.faults.clear()

    # -- request log ---------------------------------------------------------------------------------
    @on_server_loop
    def requests(
        self, method: str | None = None, path: str | None = None, *, watch: bool | None = None
    ) -> list[RecordedRequest]:
        """Requests received so far, oldest first, optionally filtered (path: exact match)."""
        return [
            r
            for r in self._state.requests
            if (method is None or r.method == method.upper())
            and (path is None or r.path == path)
            and (watch is None or r.watch == watch)
        ]

    @on_server_loop
    def clear_requests(self) -> None:
        self._state.requests.clear()

    # -- watches -------------------------------------------------------------------------------------
    @on_server_loop
    def watch_count(self, resource: str | None = None) -> int:
        """Open watch streams, on one resource (by name, as for `get`) or on all."""
        if resource is None:
            return len(self._state.watchers)
        key = self.types.resolve(resource).storage_key
        return sum(1 for w in self._state.watchers if w.rt.storage_key == key)

    async def wait_for_watches(
        self, count: int = 1, resource: str | None = None, timeout: float = 5.0
    ) -> None:
        """Wait (on the server's loop) until at least `count` watches are open."""
        deadline = time.monotonic() + timeout
        while self.watch_count(resource) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"fewer than {count} watches on {resource or 'any resource'} after {timeout}s"
                )
            await asyncio.sleep(0.01)

    def wait_for_watches_blocking(
        self, count: int = 1, resource: str | None = None, timeout: float = 5.0
    ) -> None:
        """`wait_for_watches` for code on another thread than the server's (sync tests)."""
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError(
                "wait_for_watches_blocking would block the server's own loop; await wait_for_watches"
            )
        deadline = time.monotonic() + timeout
        while self.watch_count(resource) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"fewer than {count} watches on {resource or 'any resource'} after {timeout}s"
                )
            time.sleep(0.01)

    # -- clients -------------------------------------------------------------------------------------
    def sync_configuration(self) -> Any:
        """`kubernetes.client.Configuration` for this server."""
        return clients.sync_configuration(self.url)

    def sync_api_client(self) -> Any:
        """`kubernetes.client.ApiClient` for this server (close it when done)."""
        return clients.sync_api_client(self.url)

    def aio_configuration(self) -> Any:
        """`kubernetes.aio.client.Configuration` for this server."""
        return clients.aio_configuration(self.url)

    def aio_api_client(self) -> Any:
        """`kubernetes.aio.client.ApiClient` for this server (`await close()` when done)."""
        return clients.aio_api_client(self.url)

    # -- internals -----------------------------------------------------------------------------------
    def _on_change(self, change: Change) -> None:
        self._rv_moved.set()

    async def _wait_for_rv(self, rv: int, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.store.rv < rv:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._rv_moved.clear()
            try:
                await asyncio.wait_for(self._rv_moved.wait(), remaining)
            except TimeoutError:
                return self.store.rv >= rv
        return True


class ServerThread:
    """Runs a FakeApiServer on its own event loop in a daemon thread, for sync tests and sync clients."""

    def __init__(self, server: FakeApiServer) -> None:
        self.server = server
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="fake-apiserver", daemon=True)

    def start(self) -> FakeApiServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(_CROSS_THREAD_TIMEOUT)
        return self.server

    def stop(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.server.close(), self._loop).result(_CROSS_THREAD_TIMEOUT)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_CROSS_THREAD_TIMEOUT)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()
