"""Pod Events for device allocation failures, in events.k8s.io/v1 like kube-scheduler's own.

kube-scheduler records through the events.k8s.io/v1 API (the recorded scenarios list its
`FailedScheduling` events from there), so `kubectl events` shows ours beside its: same API, our
own reportingController. Writing never blocks a request: `warn()` only queues. Repeats are
aggregated the way client-go's EventSeries does it: the first occurrence of (pod, reason, note)
is created at once; repeats within the window only bump a counter, flushed as one
`series.count` PATCH per window, so a pod retried against 5,000 nodes costs one Event, not 5,000.
Two token buckets cap the writes: one per object, as client-go's spam filter keeps (burst 25, then
one per 5 minutes), so one object's many causes cannot flood; and one for the process, set well
above a gang's burst (a 100-member gang tells each member at once), so a one-off Event such as
GangPlanned is not lost to other objects' traffic.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from allocator.runtime.kube import KubeApi, Refused
from allocator.runtime.metrics import Metrics
from apis.kinds import EVENTS
from apis.timestamps import micro_time

CONTROLLER = "topoalloc.io/allocator"
NOTE_LIMIT = 1024  # events.k8s.io/v1 validation


@dataclass
class PodRef:
    """The object an Event is about: a Pod unless `kind` says otherwise (gangs report on PodGroups,
    Reservations on themselves: cluster-scoped, `namespace` "")."""

    namespace: str
    name: str
    uid: str = ""
    kind: str = "Pod"
    api_version: str = "v1"

    @classmethod
    def of(cls, pod: dict[str, Any]) -> PodRef:
        meta = pod.get("metadata") or {}
        return cls(meta.get("namespace") or "default", meta.get("name") or "", meta.get("uid") or "")


class EventSink(Protocol):
    """What components record Events through: the `EventRecorder`, or `NullEvents` when the
    process writes none (`events: false`)."""

    def warn(self, pod: dict[str, Any] | PodRef, reason: str, action: str, note: str) -> None: ...

    def record(
        self, pod: dict[str, Any] | PodRef, type_: str, reason: str, action: str, note: str
    ) -> None: ...

    async def run(self) -> None: ...

    async def drain(self) -> None: ...


class NullEvents:
    """Events turned off: every call is accepted and nothing is written."""

    def warn(self, pod: dict[str, Any] | PodRef, reason: str, action: str, note: str) -> None:
        pass

    def record(self, pod: dict[str, Any] | PodRef, type_: str, reason: str, action: str, note: str) -> None:
        pass

    async def run(self) -> None:
        pass

    async def drain(self) -> None:
        pass


@dataclass
class _Series:
    ref: PodRef
    reason: str
    action: str
    note: str
    first_at: float
    type: str = "Warning"
    event_name: str | None = None
    count: int = 1  # occurrences so far
    written_count: int = 1  # what the Event object says
    last_write: float = 0.0


@dataclass
class _Bucket:
    rate: float
    burst: float
    tokens: float = field(init=False)
    at: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def idle(self, now: float) -> bool:
        return self.tokens + (now - self.at) * self.rate >= self.burst


OBJECT_BURST = 25  # client-go's EventSourceObjectSpamFilter defaults
OBJECT_RATE = 1 / 300
_OBJECTS_MAX = 10_000  # buckets kept before the idle (full again) ones are forgotten


class EventRecorder:
    def __init__(
        self,
        api: KubeApi,
        *,
        instance: str,
        window: float = 60.0,
        metrics: Metrics | None = None,
        rate: float = 20.0,
        burst: int = 200,
        max_queue: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.instance = instance
        self.window = window
        self.metrics = metrics
        self.clock = clock
        self._queue: asyncio.Queue[tuple[PodRef, str, str, str, str]] = asyncio.Queue(max_queue)
        self._series: dict[tuple[str, str, str, str, str], _Series] = {}
        self._bucket = _Bucket(rate, burst)
        self._objects: dict[tuple[str, str, str], _Bucket] = {}
        self.written = 0

    def _count(self, result: str) -> None:
        if self.metrics:
            self.metrics.events.labels(result).inc()

    def warn(self, pod: dict[str, Any] | PodRef, reason: str, action: str, note: str) -> None:
        self.record(pod, "Warning", reason, action, note)

    def record(self, pod: dict[str, Any] | PodRef, type_: str, reason: str, action: str, note: str) -> None:
        """Queue an Event of `type_` (Warning or Normal) about the object."""
        ref = pod if isinstance(pod, PodRef) else PodRef.of(pod)
        if not ref.name:
            return
        if len(note) > NOTE_LIMIT:
            note = note[: NOTE_LIMIT - 1] + "…"
        try:
            self._queue.put_nowait((ref, type_, reason, action, note))
        except asyncio.QueueFull:
            self._count("dropped")

    async def run(self) -> None:
        flush_every = max(self.window / 4, 0.05)
        next_flush = self.clock() + flush_every
        while True:
            timeout = max(0.0, next_flush - self.clock())
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can lose the item a
                # cancelled get() already took.
                async with asyncio.timeout(timeout):
                    item = await self._queue.get()
            except TimeoutError:
                item = None
            if item is not None:
                try:
                    await self._record(*item)
                finally:
                    self._queue.task_done()
            if self.clock() >= next_flush:
                await self._flush()
                next_flush = self.clock() + flush_every

    async def drain(self) -> None:
        """Write everything queued and every pending series count (shutdown, tests)."""
        while not self._queue.empty():
            try:
                await self._record(*self._queue.get_nowait())
            finally:
                self._queue.task_done()
        await self._queue.join()  # an item run() took is still being written
        await self._flush(force=True)

    async def _record(self, ref: PodRef, type_: str, reason: str, action: str, note: str) -> None:
        now = self.clock()
        key = (ref.kind, ref.namespace, ref.name, reason, note)
        series = self._series.get(key)
        # A series never written (the bucket or the API refused it) is no Event to count into:
        # the repeat tries to create it again, so a burst never hides a cause for good.
        if (
            series is not None
            and series.event_name is not None
            and series.ref.uid == ref.uid
            and now - series.first_at < self.window * 10
        ):
            series.count += 1
            self._count("aggregated")
            return
        series = _Series(ref, reason, action, note, first_at=now, type=type_)
        self._series[key] = series
        await self._create(series, now)

    def _take(self, ref: PodRef, now: float) -> bool:
        key = (ref.kind, ref.namespace, ref.name)
        bucket = self._objects.get(key)
        if bucket is None:
            if len(self._objects) >= _OBJECTS_MAX:
                self._objects = {k: b for k, b in self._objects.items() if not b.idle(now)}
            bucket = self._objects[key] = _Bucket(OBJECT_RATE, OBJECT_BURST)
            bucket.at = now
        return bucket.take(now) and self._bucket.take(now)

    async def _create(self, series: _Series, now: float) -> None:
        if not self._take(series.ref, now):
            self._count("dropped")
            return
        ref = series.ref
        regarding = {"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name}
        if ref.namespace:
            regarding["namespace"] = ref.namespace
        if ref.uid:
            regarding["uid"] = ref.uid
        # A cluster-scoped object (a Reservation) has its Events in "default", as Nodes do.
        namespace = ref.namespace or "default"
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            # A generateName must itself be a valid name prefix: it may end in '-', not in '.'
            # (kube-apiserver answers 422; tests/cluster pins it).
            "metadata": {"generateName": f"{ref.name}-", "namespace": namespace},
            "eventTime": micro_time(),
            "reportingController": CONTROLLER,
            "reportingInstance": self.instance[:128],
            "action": series.action,
            "reason": series.reason,
            "type": series.type,
            "note": series.note,
            "regarding": regarding,
        }
        # Said at WARNING by the client: a refused Event is otherwise invisible (users see no Events).
        what = f"event for {ref.namespace}/{ref.name} not written"
        created = await self.api.create(EVENTS.path(namespace=namespace), body, what=what)
        if isinstance(created, Refused):
            self._count("failed")
            return
        series.event_name = (created.object.get("metadata") or {}).get("name")
        series.last_write = now
        self.written += 1
        self._count("written")

    async def _flush(self, force: bool = False) -> None:
        now = self.clock()
        for key, series in list(self._series.items()):
            if series.count > series.written_count and (force or now - series.last_write >= self.window):
                if series.event_name and self._take(series.ref, now):
                    patch = {"series": {"count": series.count, "lastObservedTime": micro_time()}}
                    namespace = series.ref.namespace or "default"
                    path = EVENTS.path(series.event_name, namespace=namespace)
                    if await self.api.patch(path, patch, what="event series update failed"):
                        series.written_count = series.count
                        series.last_write = now
                        self.written += 1
                        self._count("written")
                    else:
                        self._count("failed")
            elif now - series.first_at >= self.window * 10 and now - series.last_write >= self.window:
                del self._series[key]  # forget quiet series so memory stays bounded
