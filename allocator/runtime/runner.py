"""One way to run a controller: every controller of the allocator (gangs, DRA claims, Reservations,
defragmentation, placement) is a `Reconciler` on a `Runner`.

The runner owns what every controller needs and none should spell again:
  * the keyed work queue (allocator/runtime/workqueue.py): `wake(key)` from the watch cache's
    changes, `after(key, delay)` for a deadline, `retry(key)` with per-key exponential backoff and
    `forget(key)`, a key with writes in flight never handed to a pass;
  * the loop: a wake starts a pass after `batch_delay` (a burst of watch events lands in one
    pass); every `resync` a full pass looks at every key (nothing waits on a lost event);
  * leadership: passes run only on the leader with a synced cache; leadership lost calls the
    controller's `step_down` once, and the next pass after leadership is regained is a full one;
  * one guarded pass: an exception is logged and counted, the next pass runs as usual;
  * bounded writes: `spawn(keys, coroutine)` runs at most `concurrency` write tasks at once, each
    key busy until its task ends (then looked at again), and `gather(effects)` awaits a pass's
    writes under the same bound;
  * metrics per controller (queue depth, pass time, passes, failed passes, retries) and a way for
    tests to wait for the next completed pass (`wait_passes`), so a check that nothing happened
    is made after a pass has really looked.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from allocator.runtime.workqueue import Backoff, WorkQueue

log = logging.getLogger(__name__)

PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class RunnerSettings:
    resync: float = 5.0  # seconds between full passes
    batch_delay: float = 0.05  # the pause after a wake that batches a burst of changes
    concurrency: int = 16  # write tasks at once
    backoff: Backoff = field(default_factory=Backoff)


@dataclass(frozen=True)
class Batch:
    """What a pass looks at: the keys woken or due (none with writes in flight), or, in a full
    pass, every key the controller knows."""

    keys: frozenset[str]
    full: bool
    now: float  # the runner's monotonic clock at the pass's start
    busy: Callable[[str], bool]

    def select(self, known: Iterable[str]) -> list[str]:
        """The keys of `known` this pass looks at, in order: all of them not busy in a full pass,
        else the woken ones."""
        if self.full:
            return sorted(k for k in known if not self.busy(k))
        known = known if isinstance(known, set | frozenset | dict) else set(known)
        return sorted(k for k in self.keys if k in known)


class Reconciler(Protocol):
    async def reconcile(self, batch: Batch) -> None:
        """One pass."""
        ...

    def step_down(self) -> None:
        """Leadership lost (or the process stops): hold nothing only this process knows of."""
        ...


class ControllerMetrics:
    """The runner's metrics, one family each, labelled by controller (one registry per process)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.depth = Gauge(
            "topoalloc_controller_queue_depth",
            "Keys queued, waiting for a time, or re-queued behind their writes, by controller.",
            ["controller"],
            registry=registry,
        )
        self.pass_seconds = Histogram(
            "topoalloc_controller_pass_duration_seconds",
            "Time of one controller pass (its decisions; writes spawned by it run on).",
            ["controller"],
            buckets=PASS_BUCKETS,
            registry=registry,
        )
        self.passes = Counter(
            "topoalloc_controller_passes", "Completed controller passes.", ["controller"], registry=registry
        )
        self.failed = Counter(
            "topoalloc_controller_failed_passes",
            "Controller passes that raised (logged; the next pass runs as usual).",
            ["controller"],
            registry=registry,
        )
        self.retries = Counter(
            "topoalloc_controller_retries",
            "Keys put back with a backoff pause after a refused or failed step.",
            ["controller"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "topoalloc_controller_writes_in_flight",
            "Write tasks running, by controller.",
            ["controller"],
            registry=registry,
        )


class Runner:
    def __init__(
        self,
        name: str,
        controller: Reconciler,
        settings: RunnerSettings,
        *,
        is_leader: Callable[[], bool],
        synced: Callable[[], bool],
        metrics: ControllerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.controller = controller
        self.settings = settings
        self.is_leader = is_leader
        self.synced = synced
        self.clock = clock
        self.queue = WorkQueue(settings.backoff)
        self.queue.request_full()  # the first pass looks at everything
        self.passes = 0
        self.leading = False
        self._metrics = metrics
        if metrics is not None:  # this controller's series at zero from the start
            for family in (metrics.pass_seconds, metrics.passes, metrics.failed, metrics.retries):
                family.labels(name)
        self._wake = asyncio.Event()
        self._passed = asyncio.Condition()
        self._slots = asyncio.Semaphore(max(1, settings.concurrency))
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_full = -math.inf

    # -- what wakes a pass ------------------------------------------------------------------------

    def wake(self, key: str | None = None) -> None:
        """Look at `key` (or, with None, just run a pass) soon."""
        if key is not None:
            self.queue.add(key)
        self._wake.set()

    def wake_all(self, keys: Iterable[str] = ()) -> None:
        self.queue.add_all(keys)
        self._wake.set()

    def resync(self) -> None:
        """The next pass looks at every key."""
        self.queue.request_full()
        self._wake.set()

    def after(self, key: str, delay: float) -> None:
        """Look at `key` again in `delay` seconds (or sooner, if woken)."""
        self.queue.add_after(key, delay, self.clock())
        self._wake.set()  # the loop's wait is shortened to the new time

    def retry(self, key: str) -> float:
        """`key` failed or was refused: look at it again after its backoff pause (the pause)."""
        if self._metrics is not None:
            self._metrics.retries.labels(self.name).inc()
        pause = self.queue.retry(key, self.clock())
        self._wake.set()
        return pause

    def forget(self, key: str) -> None:
        self.queue.forget(key)

    def waiting(self, key: str) -> bool:
        """`key` waits for its retry's (or a delayed re-add's) time and was not woken since."""
        return self.queue.waiting(key, self.clock())

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            # A follower looks again when woken or a resync period later (leadership is checked).
            resync_at = (
                self._last_full + self.settings.resync
                if self.leading
                else self.clock() + self.settings.resync
            )
            await self._sleep(resync_at)
            if not (self.is_leader() and self.synced()):
                if self.leading:
                    self._step_down()
                continue
            if not self.leading:
                self.leading = True
                self.queue.request_full()
            await self.run_pass()

    async def _sleep(self, resync_at: float) -> None:
        """Until a wake (then `batch_delay` more), a delayed key's time, or `resync_at`. A follower
        waits for a wake or `resync_at` alone: the keys queued meanwhile wait for its first pass as
        leader (were they counted, it would look at its leadership every `batch_delay`)."""
        now = self.clock()
        if not (self.leading and self.queue.pending(now)):
            until = min(resync_at, self.queue.next_due()) if self.leading else resync_at
            try:
                async with asyncio.timeout(max(0.0, until - now)):
                    await self._wake.wait()
                await asyncio.sleep(self.settings.batch_delay)
            except TimeoutError:
                pass
        else:
            await asyncio.sleep(self.settings.batch_delay)
        self._wake.clear()

    async def run_pass(self) -> None:
        """One guarded pass over what is due (tests call it to step a controller by hand)."""
        now = self.clock()
        if now - self._last_full >= self.settings.resync:
            self.queue.request_full()
        taken = self.queue.take(now)
        if taken.full:
            self._last_full = now
        batch = Batch(taken.keys, taken.full, now, self.queue.busy)
        started = time.perf_counter()
        try:
            await self.controller.reconcile(batch)
        except Exception:  # a bug in one pass must not stop the controller for good
            log.exception("%s controller pass failed", self.name)
            if self._metrics is not None:
                self._metrics.failed.labels(self.name).inc()
        finally:
            self.passes += 1
            if self._metrics is not None:
                m = self._metrics
                m.pass_seconds.labels(self.name).observe(time.perf_counter() - started)
                m.passes.labels(self.name).inc()
                m.depth.labels(self.name).set(len(self.queue))
            async with self._passed:
                self._passed.notify_all()

    def _step_down(self) -> None:
        self.leading = False
        try:
            self.controller.step_down()
        except Exception:
            log.exception("%s controller: stepping down failed", self.name)

    def stop(self) -> None:
        """The process stops: the controller holds nothing (writes in flight finish or are cancelled
        with the loop)."""
        self._step_down()

    async def wait_passes(self, count: int = 1, timeout: float = 30.0) -> None:
        """Wait until `count` more passes have completed (tests: "nothing happened" is checked
        after the controller has really looked)."""
        target = self.passes + count
        self._wake.set()
        async with asyncio.timeout(timeout), self._passed:
            await self._passed.wait_for(lambda: self.passes >= target)

    # -- writes -----------------------------------------------------------------------------------

    def spawn(self, keys: Sequence[str], coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` (the writes of `keys`) as a task, at most `concurrency` at once; the keys are
        busy until it ends, then looked at again if they changed meanwhile."""
        self.queue.begin(keys)

        async def run() -> None:
            try:
                async with self._slots:
                    self._gauge_in_flight(1)
                    try:
                        await coro
                    finally:
                        self._gauge_in_flight(-1)
            except Exception:
                log.exception("%s controller: writes of %s failed", self.name, ", ".join(keys))
            finally:
                self.queue.done(keys)
                self._wake.set()

        task = asyncio.get_running_loop().create_task(run(), name=f"{self.name} {keys[0] if keys else ''}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def gather(self, effects: Iterable[Awaitable[None]]) -> None:
        """Await a pass's writes together, at most `concurrency` at once."""

        async def bounded(effect: Awaitable[None]) -> None:
            async with self._slots:
                await effect

        await asyncio.gather(*(bounded(e) for e in effects))

    def busy(self, key: str) -> bool:
        return self.queue.busy(key)

    async def drain(self) -> None:
        """Wait for the write tasks in flight (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def _gauge_in_flight(self, by: int) -> None:
        if self._metrics is not None:
            self._metrics.in_flight.labels(self.name).inc(by)
