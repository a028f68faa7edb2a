"""An asyncio reflector: LIST, then WATCH from the list's resourceVersion, forever.

client-go's reflector semantics on raw dicts (none of the Python clients has an async informer,
python-stack-notes section 2):
  * resume the watch from the last resourceVersion seen, BOOKMARKs included;
  * on 410 Gone in either form (HTTP 410 on a LIST, an ERROR event with code 410 on a WATCH) LIST
    again; the sink diffs the new list against what it holds and so learns of deletions that
    happened while we were not watching;
  * a kind the server may not serve (a CRD, an alpha API: `Kind.optional` asks API discovery
    first) is an empty set while it is absent, looked for again every `backoff.maximum` seconds
    and whenever a watch of it answers 404 (the server restarted without it);
  * any other failure waits with jittered exponential backoff (the official SharedInformer
    hot-loops here: 1,988 requests in 2 s against a failing watch).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterable
from typing import Any, Protocol

from allocator.runtime.kube import ApiError, Kind, KubeApi
from allocator.runtime.metrics import Metrics

log = logging.getLogger(__name__)

JSON = dict[str, Any]


class Sink(Protocol):
    def replace(self, kind: Kind, items: Iterable[JSON]) -> None:
        """The complete current set of objects of `kind` (after a LIST). `items` may be iterated
        more than once; each iteration may decode them again (kube.ListPages)."""

    def apply(self, kind: Kind, event_type: str, obj: JSON) -> None:
        """One ADDED, MODIFIED or DELETED event."""


class Backoff:
    """Exponential backoff with jitter in [delay/2, delay]."""

    def __init__(self, initial: float = 0.5, maximum: float = 30.0, rng: random.Random | None = None) -> None:
        self.initial = initial
        self.maximum = maximum
        self.rng = rng or random.Random()
        self.attempt = 0

    def next(self) -> float:
        delay = min(self.maximum, self.initial * (2**self.attempt))
        self.attempt = min(self.attempt + 1, 32)
        return self.rng.uniform(delay / 2, delay)

    def reset(self) -> None:
        self.attempt = 0


class _Relist(Exception):
    def __init__(self, cause: str) -> None:
        self.cause = cause


class Reflector:
    def __init__(
        self,
        api: KubeApi,
        kind: Kind,
        sink: Sink,
        *,
        metrics: Metrics | None = None,
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
    ) -> None:
        self.api = api
        self.kind = kind
        self.sink = sink
        self.metrics = metrics
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff()
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.lists = 0
        self.watches = 0
        self.missing = False  # the kind's CRD is not installed

    @property
    def has_synced(self) -> bool:
        return self.synced.is_set()

    async def run(self) -> None:
        cause = "initial"
        while True:
            try:
                if cause:
                    await self._relist(cause)
                    cause = ""
                    self.backoff.reset()
                await self._watch()
            except _Relist as again:
                cause = again.cause  # relist at once, as client-go does after a 410
            except (ApiError, ValueError, OSError, TimeoutError) as exc:
                # ValueError: a line that is not JSON. OSError covers aiohttp's connection errors.
                if self.metrics:
                    self.metrics.watch_errors.labels(self.kind.name).inc()
                if isinstance(exc, ApiError) and exc.gone:
                    cause = "expired"
                    continue
                if isinstance(exc, ApiError) and exc.not_found and self.kind.custom:
                    # The CRD was deleted, or the server came back without the alpha API: the
                    # relist finds out which (and empties the set).
                    cause = "not-found"
                    continue
                delay = self.backoff.next()
                log.warning("%s reflector: %s; retrying in %.1fs", self.kind.name, exc, delay)
                await asyncio.sleep(delay)
            except Exception:
                # A bug, most likely in the sink: the cache may be half-updated, so start over
                # from a full LIST rather than die and leave it stale for good.
                log.exception("%s reflector: unexpected error; relisting", self.kind.name)
                if self.metrics:
                    self.metrics.watch_errors.labels(self.kind.name).inc()
                cause = "error"
                await asyncio.sleep(self.backoff.next())

    async def _relist(self, cause: str) -> None:
        if self.kind.optional and not await self.api.serves(self.kind):
            await self._absent("is not served (an alpha API that is off)")
        try:
            items, rv = await self.api.list_pages(self.kind)
        except ApiError as exc:
            forbidden = exc.status == 403 and self.kind.optional
            if not (exc.not_found and self.kind.custom) and not forbidden:
                raise
            # The CRD is not installed (no PodGroups without scheduler-plugins, no Devices before
            # the agent's CRD), or an optional kind RBAC does not let us read: that is an empty
            # set, not an outage. Look again later.
            await self._absent(
                "may not be listed (RBAC)" if forbidden else "is not installed (its CRD or API)"
            )
        self.missing = False
        self.lists += 1
        self.sink.replace(self.kind, items)
        self.resource_version = rv
        if self.metrics:
            self.metrics.relists.labels(self.kind.name, cause).inc()
        if self.synced.is_set():
            log.info("%s relisted (%s): %d objects", self.kind.name, cause, len(items))
        self._mark_synced(len(items), rv)

    async def _absent(self, why: str) -> None:
        """The kind is not there: an empty set (said once), looked for again after a while."""
        if not self.missing:
            kind = self.kind
            log.warning("%s: %s.%s %s; treating it as empty", kind.name, kind.plural, kind.group, why)
        self.missing = True
        self.sink.replace(self.kind, [])
        self._mark_synced(0, "")
        await asyncio.sleep(self.backoff.maximum)
        raise _Relist("not-served")

    def _mark_synced(self, count: int, rv: str) -> None:
        if self.metrics:
            self.metrics.cache_objects.labels(self.kind.name).set(count)
        if not self.synced.is_set():
            log.info("%s cache synced: %d objects at resourceVersion %r", self.kind.name, count, rv)
            self.synced.set()
            if self.metrics:
                self.metrics.cache_synced.labels(self.kind.name).set(1)

    async def _watch(self) -> None:
        started = time.monotonic()
        events = 0
        self.watches += 1
        async for event in self.api.watch(
            self.kind, self.resource_version, timeout_seconds=self.watch_timeout
        ):
            etype = event.get("type")
            obj = event.get("object")
            if not isinstance(obj, dict):
                raise ValueError(f"watch event without an object: {str(event)[:200]}")
            if etype == "ERROR":
                code = obj.get("code")
                if code == 410:
                    raise _Relist("expired")
                raise ApiError(int(code or 0), str(obj.get("reason", "")), str(obj.get("message", "")), obj)
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if etype in ("ADDED", "MODIFIED", "DELETED"):
                self.sink.apply(self.kind, etype, obj)
            elif etype != "BOOKMARK":
                log.warning("%s watch: ignoring event type %r", self.kind.name, etype)
            if rv:
                self.resource_version = str(rv)
            events += 1
            if events == 1:
                self.backoff.reset()
        # A normal end (timeoutSeconds elapsed): resume from the last resourceVersion. A server
        # that closes at once without events must not make us spin.
        if events == 0 and time.monotonic() - started < 1.0:
            await asyncio.sleep(self.backoff.next())
