"""Reservations as a component of the allocator process (allocator/runtime/component.py): the book
of rooms and the pods kube-scheduler holds back, fed by the watch cache, the steering of the core's
node decisions (allocator/runtime/steering.py), the hold ledger's placer (an owner's devices come
from its room) and the controller on its runner (woken by the book's changes). This package never
imports the extender; allocator/assembly.py builds `ReservationScheduling`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from allocator.reservations.book import RoomBook
from allocator.reservations.cache_view import ReservationCache
from allocator.reservations.controller import ReservationController
from allocator.reservations.pass_view import PassInputs
from allocator.reservations.placing import ClusterDoor
from allocator.reservations.steering import RoomSteering
from allocator.reservations.waiting import WaitingPods
from allocator.runtime.admission import Reviewer
from allocator.runtime.coreadapter import CoreAdapter, FilterVerdicts, PodRequest, Rejection
from allocator.runtime.events import EventSink
from allocator.runtime.kube import KubeApi
from allocator.runtime.ledger import no_placer
from allocator.runtime.reservation_settings import ReservationSettings
from allocator.runtime.runner import ControllerMetrics
from allocator.runtime.steering import Steering
from allocator.runtime.tasks import Spawn
from allocator.runtime.topology import Topology

JSON = dict[str, Any]


class ReservationScheduling:
    """A `Component`; its `Steering` is itself. Building it makes it the ledger's placer."""

    name = "reservations"

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
        topology: Topology,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        """`topology`: the allocator's profile (gangs of Reservations keep to its levels);
        `metrics`: the process's controller metrics (the controller's runner reports there)."""
        self.cache = cache
        self.book = RoomBook(cache, core)
        self.waiting = WaitingPods()
        self.steer = RoomSteering(self.book, core, events)
        self.controller = ReservationController(
            api=api,
            book=self.book,
            door=ClusterDoor(cache, core, self.book, self.steer, self.waiting),
            inputs=PassInputs(api, cache, self.book, lambda: topology.profile),
            settings=settings,
            events=events,
            is_leader=is_leader,
            synced=synced,
            metrics=metrics,
        )
        self.runner = self.controller.runner
        # Owners' binds take from their rooms; a bind the ledger lets go of gives back.
        cache.ledger.placer = self.steer.place
        cache.ledger.on_drop.append(self.book.dropped)
        cache.ledger.on_move.append(self.book.moved)

    # -- Steering ---------------------------------------------------------------------------------

    def filter(self, pod: JSON, req: PodRequest, names: Sequence[str]) -> FilterVerdicts | None:
        if req.invalid is not None:
            return None  # the core refuses it as it is
        return self.steer.filter(pod, req, names)

    def scores(
        self, pod: JSON, req: PodRequest, names: Sequence[str], scores: np.ndarray
    ) -> np.ndarray | None:
        return self.steer.scores(pod, req, names, scores)

    def bind_refusal(self, req: PodRequest, node: str) -> Rejection | None:
        return None  # an owner's devices come from its room through the ledger's placer

    # -- Component --------------------------------------------------------------------------------

    def routes(self) -> Mapping[str, Reviewer]:
        return {}

    def steering(self) -> Sequence[Steering]:
        return (self,)

    def observe(self, kind: str, key: str, obj: JSON | None) -> None:
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
        if self.cache.ledger.placer == self.steer.place:
            self.cache.ledger.placer = no_placer
