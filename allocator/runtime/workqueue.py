"""The keyed work queue every controller runs on (allocator/runtime/runner.py).

As client-go's rate-limited work queue, shaped for controllers that look at many keys in one pass:
  * a key added many times before a pass is looked at once (de-duplication);
  * `add_after` brings a key back at a time (the earliest asked wins); `add` brings it now, also
    when it was waiting for a later time;
  * `retry` brings it back after a pause that doubles with every retry of that key, up to a cap;
    `forget` starts the key's pauses afresh (it went through);
  * a key whose work is in flight (`begin` ... `done`) is never handed out: added meanwhile it is
    marked, and comes back when its work is done;
  * `full` asks the next pass to look at every key the controller knows (a resync).

Synchronous and single-threaded (the allocator runs one event loop); time is the caller's
monotonic clock, so the queue is tested without sleeping.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    initial: float = 0.5
    cap: float = 60.0

    def pause(self, failures: int) -> float:
        """The pause before the `failures`-th retry (1, 2, ...)."""
        return min(self.cap, self.initial * 2 ** max(0, failures - 1))


@dataclass(frozen=True)
class Taken:
    """What one pass is handed: the keys due now (none busy), and whether to look at all."""

    keys: frozenset[str]
    full: bool


class WorkQueue:
    def __init__(self, backoff: Backoff | None = None) -> None:
        self.backoff = backoff or Backoff()
        self._ready: set[str] = set()
        self._due: dict[str, float] = {}  # key -> the time it is due (the earliest asked)
        self._heap: list[tuple[float, str]] = []  # (due, key), stale entries skipped
        self._busy: set[str] = set()
        self._again: set[str] = set()  # added while busy: ready once done
        self._failures: dict[str, int] = {}
        self._full = False

    # -- adding -------------------------------------------------------------------------------------

    def add(self, key: str) -> None:
        if key in self._busy:
            self._again.add(key)
            return
        self._ready.add(key)
        self._due.pop(key, None)

    def add_all(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.add(key)

    def add_after(self, key: str, delay: float, now: float) -> None:
        """Bring `key` back at `now + delay` (or earlier, if it is already due earlier)."""
        if delay <= 0:
            self.add(key)
            return
        if key in self._ready:
            return
        at = now + delay
        if at < self._due.get(key, math.inf):
            self._due[key] = at
            heapq.heappush(self._heap, (at, key))

    def retry(self, key: str, now: float) -> float:
        """Bring `key` back after its next pause; the pause."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        pause = self.backoff.pause(failures)
        self._ready.discard(key)
        self._due.pop(key, None)  # the retry's time replaces an earlier one
        self.add_after(key, pause, now)
        return pause

    def forget(self, key: str) -> None:
        """The key went through: its next retry pauses `initial` again."""
        self._failures.pop(key, None)

    def retries(self, key: str) -> int:
        return self._failures.get(key, 0)

    def request_full(self) -> None:
        self._full = True

    def remove(self, key: str) -> None:
        """The key is gone for good (its object was deleted): nothing of it is kept."""
        self._ready.discard(key)
        self._due.pop(key, None)
        self._again.discard(key)
        self._failures.pop(key, None)

    # -- work in flight -----------------------------------------------------------------------------

    def begin(self, keys: Iterable[str]) -> None:
        self._busy.update(keys)

    def done(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._busy.discard(key)
            if key in self._again:
                self._again.discard(key)
                self.add(key)

    def busy(self, key: str) -> bool:
        return key in self._busy

    # -- taking -------------------------------------------------------------------------------------

    def waiting(self, key: str, now: float) -> bool:
        """`key` waits for a later time (a retry's pause, a delayed re-add) and nothing changed."""
        return key not in self._ready and self._due.get(key, -math.inf) > now

    def next_due(self) -> float:
        """When the earliest delayed key is due (inf: none)."""
        while self._heap and self._due.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else math.inf

    def pending(self, now: float) -> bool:
        return bool(self._ready) or self._full or self.next_due() <= now

    def take(self, now: float) -> Taken:
        """The keys due by `now` (busy ones stay queued for later) and the resync request."""
        while self._heap and self._heap[0][0] <= now:
            at, key = heapq.heappop(self._heap)
            if self._due.get(key) == at:
                del self._due[key]
                self._ready.add(key)
        keys = frozenset(k for k in self._ready if k not in self._busy)
        self._ready -= keys
        for key in self._ready:  # busy: back once done
            self._again.add(key)
        self._ready.clear()
        full, self._full = self._full, False
        return Taken(keys, full)

    def __len__(self) -> int:
        return len(self._ready) + len(self._due) + len(self._again)
