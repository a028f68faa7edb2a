"""The Reservation controller (leader only): runs the core's Reservation lifecycle on the runner and
carries out what it decides.

The decisions are the core's (allocator/core/reservation/lifecycle.py: expire, follow owners, place
alone or as a gang, preempt, write, offer freed room to the pods kube-scheduler holds back); this
module only acts. A pass (woken by the book's changes, at a Reservation's expiry or preemption
deadline, and a full one every `resyncPeriod`: allocator/runtime/runner.py) builds the view of the
Reservations woken, each gang of them whole (pass_view.py), steps with the cluster behind the door
(placing.py: the core's placements, the book's rooms held and given back at once), and carries out
each action: a Reservation's writes in order (a refused one retried after its backoff pause, the
condition written remembered for the next view), evictions, nudges, deadlines.

A restarted or new leader finds every written room in the API (the book rebuilds it); a room held
but not yet written is released when leadership is lost and placed afresh by the next leader.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from allocator.core.actions import Annotate, Event, Evict, Nudge, ObjectRef, Requeue, WriteStatus
from allocator.core.gang.victims import Candidate
from allocator.core.reservation.lifecycle import LifecycleSettings, WriteInOrder, step
from allocator.reservations import writes
from allocator.reservations.book import RoomBook
from allocator.reservations.pass_view import PassInputs
from allocator.reservations.placing import ClusterDoor
from allocator.runtime.events import EventSink, PodRef
from allocator.runtime.evictions import evict
from allocator.runtime.kube import KubeApi
from allocator.runtime.nudge import nudge
from allocator.runtime.reservation_settings import ReservationSettings
from allocator.runtime.runner import Batch, ControllerMetrics, Runner, RunnerSettings

log = logging.getLogger(__name__)

Effect = Awaitable[None]


class ReservationController:
    def __init__(
        self,
        *,
        api: KubeApi,
        book: RoomBook,
        door: ClusterDoor,
        inputs: PassInputs,
        settings: ReservationSettings,
        events: EventSink,
        is_leader: Callable[[], bool],
        synced: Callable[[], bool],
        metrics: ControllerMetrics | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.book = book
        self.door = door
        self.inputs = inputs
        self.events = events
        self.wall = wall
        self.lifecycle = LifecycleSettings(
            preemption=settings.preemption,
            preemption_timeout=settings.preemption_timeout,
            scheduler_names=tuple(settings.scheduler_names),
        )
        self.runner = Runner(
            "reservations",
            self,
            RunnerSettings(resync=settings.resync_period, batch_delay=settings.batch_delay),
            is_leader=is_leader,
            synced=synced,
            metrics=metrics,
        )
        self._evicting: set[str] = set()  # victims whose eviction is in flight

    def step_down(self) -> None:
        """Leadership lost: rooms held here but not written are the next leader's to place."""
        for entry in list(self.book.entries.values()):
            if entry.placed_here:
                self.book.release(entry.name)
        self.book.take_freed()  # a follower offers no room

    async def reconcile(self, batch: Batch) -> None:
        view = await self.inputs.view(batch)
        now = self.wall()
        actions = step(view, now, self.door, self.lifecycle)
        self.book.take_freed()  # what the step gave back, it offered already
        effects: list[Effect] = []
        for action in actions:
            match action:
                case WriteInOrder(key, steps, event, said):
                    effects.append(self._write(key, steps, event, said))
                case Evict(pod, node) if pod.key not in self._evicting:
                    effects.append(self._evict(pod, node))
                case Evict():
                    pass  # already in flight
                case Nudge(pod, node):
                    effects.append(self._nudge(pod, node, now))
                case Requeue(key, after):
                    self.runner.after(key, after)
        await self.runner.gather(effects)

    # -- carrying actions out ------------------------------------------------------------------------

    async def _write(
        self, key: str, steps: tuple[Annotate | WriteStatus, ...], event: Event | None, said: str | None
    ) -> None:
        for w in steps:
            target = w.target
            if isinstance(w, Annotate):
                ok = await writes.annotate(self.api, target.name, target.uid, dict(w.annotations))
            else:
                ok = await writes.patch_status(self.api, target.name, target.uid, w.status)
            if not ok:
                self.runner.retry(key)  # looked at again after its backoff pause
                return
        self.runner.forget(key)
        if steps:
            self.inputs.remember(key, steps[0].target.uid, said)
        if event is not None:
            t = event.target
            ref = PodRef(t.namespace, t.name, t.uid, t.kind, t.api_version)
            self.events.record(ref, event.type, event.reason, event.action, event.note)

    async def _evict(self, pod: ObjectRef, node: str) -> None:
        self._evicting.add(pod.key)
        try:
            why = await evict(self.api, Candidate(pod.key, node, 0, "", pod.uid))
        finally:
            self._evicting.discard(pod.key)
        if why:
            log.info("evicting %s for a reservation: %s (tried again next pass)", pod.key, why)

    async def _nudge(self, pod: ObjectRef, node: str, now: float) -> None:
        if await nudge(self.api, pod, f"room freed on {node}", now):
            log.info("nudged %s: room freed on %s", pod.key, node)
