"""Reservations behind the extender's seam (`ReservationHooks`, allocator/extender/reservation_hooks.py,
implemented structurally: this package never imports the extender) and the hold ledger's placer:
the book and the pods kube-scheduler holds back, fed by the watch cache, the steering of the verbs,
the controller on its runner (woken by the book's changes). allocator/assembly.py builds
`ReservationScheduling` and plugs it in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from allocator.reservations.book import RoomBook
from allocator.reservations.cache_view import ReservationCache
from allocator.reservations.controller import ReservationController
from allocator.reservations.pass_view import PassInputs
from allocator.reservations.placing import ClusterDoor
from allocator.reservations.steering import RoomSteering
from allocator.reservations.waiting import WaitingPods
from allocator.runtime.coreadapter import CoreAdapter, FilterVerdicts, PodRequest
from allocator.runtime.events import EventSink
from allocator.runtime.kube import KubeApi
from allocator.runtime.ledger import no_placer
from allocator.runtime.reservation_settings import ReservationSettings
from allocator.runtime.runner import ControllerMetrics
from allocator.runtime.tasks import Spawn
from apis.topology_profile import TopologyProfile

JSON = dict[str, Any]


class ReservationScheduling:
    """Implements `ReservationHooks`; `attach` makes it the ledger's placer and listener."""

    def __init__(
        self,
        settings: ReservationSettings,
        *,
        api: KubeApi,
        cache: ReservationCache,
        core: CoreAdapter,
        events: EventSink,
        is_leader: Callable[[], bool],
        synced: Callable[[], bool],
        profile: Callable[[], TopologyProfile] | None = None,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        """`profile`: the allocator's topology profile (gangs of Reservations keep to its levels);
        `metrics`: the process's controller metrics (the controller's runner reports there)."""
        self.cache = cache
        self.book = RoomBook(cache, core)
        self.waiting = WaitingPods()
        self.steering = RoomSteering(self.book, core, events)
        self.controller = ReservationController(
            api=api,
            book=self.book,
            door=ClusterDoor(cache, core, self.book, self.steering, self.waiting),
            inputs=PassInputs(api, cache, self.book, profile),
            settings=settings,
            events=events,
            is_leader=is_leader,
            synced=synced,
            metrics=metrics,
        )
        self.runner = self.controller.runner

    def attach(self) -> None:
        """Owners' binds take from their rooms; a bind the ledger lets go of gives back."""
        self.cache.ledger.placer = self.steering.place
        self.cache.ledger.on_drop.append(self.book.dropped)

    # -- ReservationHooks ---------------------------------------------------------------------------

    def steer_filter(self, pod: JSON, req: PodRequest, names: Sequence[str]) -> FilterVerdicts | None:
        return self.steering.filter(pod, req, names)

    def steer_scores(
        self, pod: JSON, req: PodRequest, names: Sequence[str], scores: np.ndarray
    ) -> np.ndarray | None:
        return self.steering.scores(pod, req, names, scores)

    def observe(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        book = self.book
        freed = bool(book.freed)
        book.observe(kind, key, obj)
        if kind == "Pod":
            self.waiting.observe(key, obj)
        if book.dirty:
            self.runner.wake_all(book.take_dirty())
        if book.freed and not freed:
            self.runner.wake()  # room to offer to the pods kube-scheduler holds back

    def start(self, spawn: Spawn) -> None:
        spawn("reservation controller", self.runner.run())

    def stop(self) -> None:
        """Rooms live in the API (those placed here but not written are let go); the ledger goes
        with the process."""
        self.runner.stop()
        if self.cache.ledger.placer == self.steering.place:
            self.cache.ledger.placer = no_placer
