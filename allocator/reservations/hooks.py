"""Reservations behind the extender's seam (`ReservationHooks`, allocator/extender/reservation_hooks.py,
implemented structurally: this package never imports the extender) and the hold ledger's placer:
the book fed by the watch cache, the steering of the verbs, the controller. allocator/assembly.py
builds `ReservationScheduling` and plugs it in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from allocator.reservations.book import RoomBook
from allocator.reservations.cache_view import ReservationCache
from allocator.reservations.controller import ReservationController
from allocator.reservations.steering import RoomSteering
from allocator.runtime.coreadapter import CoreAdapter, FilterVerdicts, PodRequest
from allocator.runtime.events import EventSink
from allocator.runtime.kube import KubeApi
from allocator.runtime.ledger import no_placer
from allocator.runtime.reservation_settings import ReservationSettings
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
    ) -> None:
        """`profile`: the allocator's topology profile (gangs of Reservations keep to its levels)."""
        self.cache = cache
        self.book = RoomBook(cache, core)
        self.steering = RoomSteering(self.book, core, events)
        self.controller = ReservationController(
            api=api,
            cache=cache,
            core=core,
            book=self.book,
            settings=settings,
            events=events,
            is_leader=is_leader,
            synced=synced,
            profile=profile,
        )

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
        self.book.observe(kind, key, obj)
        self.controller.wake()

    def start(self, spawn: Spawn) -> None:
        spawn("reservation controller", self.controller.run())

    def stop(self) -> None:
        """Nothing is held only here: rooms live in the API; the ledger goes with the process."""
        if self.cache.ledger.placer == self.steering.place:
            self.cache.ledger.placer = no_placer
