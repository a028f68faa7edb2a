"""One watch connection: initial events, live changes filtered the way the watch cache filters them,
periodic and pre-timeout BOOKMARKs, and the end of the stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from . import errors
from .objects import encode
from .operations import Operations
from .reads import ListQuery, parse_resource_version
from .resources import ResourceType
from .store import Change, TooOld, with_resource_version

JsonObj = dict[str, Any]
Write = Callable[[bytes], Awaitable[None]]

# Ends of a stream, as `Watcher.run` reports them.
END_TIMEOUT = "timeout"
END_BROKEN = "broken"  # break_watches(): stream closed cleanly by the server
END_ABORTED = "aborted"  # break_watches(abort=True): connection dropped
END_OVERFLOW = "overflow"  # the client read too slowly (the apiserver drops such watchers too)
END_SHUTDOWN = "shutdown"


@dataclass(frozen=True)
class WatchSettings:
    bookmark_interval: float = 60.0  # the apiserver's is about a minute
    bookmark_before_timeout: float = 2.0  # and one more 2 s before the watch's deadline
    queue_limit: int = 10_000


@dataclass(frozen=True)
class _Stop:
    reason: str


def event_line(type_: str, obj: JsonObj, *, sort_keys: bool = False) -> bytes:
    """`{"type":T,"object":{...}}\\n`, with `type` first as on the wire."""
    body = encode(obj, sort_keys=sort_keys).rstrip(b"\n")
    return b'{"type":' + json.dumps(type_).encode() + b',"object":' + body + b"}\n"


def error_line(error: errors.ApiError) -> bytes:
    return event_line("ERROR", error.status())


class Watcher:
    def __init__(
        self,
        ops: Operations,
        rt: ResourceType,
        namespace: str,
        query: ListQuery,
        *,
        bookmarks: bool,
        settings: WatchSettings,
    ) -> None:
        self.ops = ops
        self.rt = rt
        self.namespace = namespace
        self.query = query
        self.bookmarks = bookmarks
        self.settings = settings
        self.queue: asyncio.Queue[tuple[str, JsonObj] | _Stop] = asyncio.Queue()
        self.start_rv = 0  # where the watch began: bookmarks are sent only once the store moved past it
        self.last_rv = 0  # the newest resourceVersion this client has been told about
        self._subscribed = False
        self._stopped = False

    def begin(self, resource_version: str) -> None:
        """Queue the initial events and start following the store. Raises the ApiError that the
        client must get as an ERROR event (410 for a resourceVersion older than the history)."""
        store = self.ops.store
        if resource_version in ("", "0"):
            for obj in store.list(self.rt.storage_key):
                if self.ops.matches(self.rt, obj, self.namespace, self.query):
                    self._put("ADDED", obj)
            self.start_rv = self.last_rv = store.rv
        else:
            start = parse_resource_version(resource_version)
            self.start_rv = self.last_rv = start
            try:
                backlog = store.changes_since(self.rt.storage_key, start)
            except TooOld as exc:
                raise errors.watch_too_old(exc.requested, exc.oldest) from exc
            for change in backlog:
                self.offer(change)
        store.subscribe(self.offer)
        self._subscribed = True

    def offer(self, change: Change) -> None:
        """Store listener: translate one change into this watcher's event, if it concerns it.

        An object that stops matching the selectors arrives as DELETED (its previous state with the new
        resourceVersion), one that starts matching as ADDED, as the apiserver's watch cache does."""
        if change.storage != self.rt.storage_key or self._stopped:
            return
        now_matches = change.type != "DELETED" and self.ops.matches(
            self.rt, change.obj, self.namespace, self.query
        )
        was_matching = change.prev is not None and self.ops.matches(
            self.rt, change.prev, self.namespace, self.query
        )
        if now_matches:
            self._put("MODIFIED" if was_matching else "ADDED", change.obj)
        elif was_matching:
            assert change.prev is not None
            self._put("DELETED", with_resource_version(change.prev, change.rv))
        if self.queue.qsize() > self.settings.queue_limit:
            self.stop(END_OVERFLOW)

    def _put(self, type_: str, stored: JsonObj) -> None:
        self.queue.put_nowait((type_, self.ops.present(self.rt, stored)))
        self.last_rv = int(stored["metadata"]["resourceVersion"])

    def stop(self, reason: str) -> None:
        if not self._stopped:
            self._stopped = True
            self.queue.put_nowait(_Stop(reason))

    def close(self) -> None:
        if self._subscribed:
            self.ops.store.unsubscribe(self.offer)
            self._subscribed = False

    async def run(self, write: Write, timeout: float) -> str:
        """Stream events until the deadline, a stop, or a write failure; returns why it ended."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_bookmark = self._next_bookmark(loop.time(), deadline) if self.bookmarks else None
        while True:
            now = loop.time()
            if now >= deadline:
                return END_TIMEOUT
            if next_bookmark is not None and now >= next_bookmark and self.queue.empty():
                await self._bookmark(write)
                next_bookmark = self._next_bookmark(now, deadline)
                continue
            wake = deadline if next_bookmark is None else min(deadline, next_bookmark)
            try:
                # Not asyncio.wait_for: on Python 3.11 it can drop the item a cancelled get() took
                # and hang in _cancel_and_wait (timeout 0), which stalled whole watch streams.
                async with asyncio.timeout(max(wake - now, 0.0)):
                    item = await self.queue.get()
            except TimeoutError:
                continue
            if isinstance(item, _Stop):
                return item.reason
            type_, obj = item
            await write(event_line(type_, obj, sort_keys=self.rt.custom))

    async def _bookmark(self, write: Write) -> None:
        """A BOOKMARK carries the newest resourceVersion; like the watch cache, the apiserver sends none
        while nothing happened after the watch's starting resourceVersion (recorded: idle watch)."""
        current = self.ops.store.rv
        if current <= self.start_rv:
            return
        self.last_rv = current
        meta: JsonObj = {"resourceVersion": str(current)}
        if not self.rt.custom:
            meta["creationTimestamp"] = None
        obj = {
            "kind": self.rt.kind,
            "apiVersion": self.rt.api_version,
            "metadata": meta,
            **self.rt.bookmark_body,
        }
        await write(event_line("BOOKMARK", obj, sort_keys=self.rt.custom))

    def _next_bookmark(self, now: float, deadline: float) -> float | None:
        at = min(now + self.settings.bookmark_interval, deadline - self.settings.bookmark_before_timeout)
        return at if at > now else None
