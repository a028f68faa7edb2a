"""What the verbs and the health app read of the running service.

`server.Allocator` is the one implementation; naming it here instead would make the handlers and
the server import each other (the server builds the apps from the handlers)."""

from __future__ import annotations

from typing import Protocol

from allocator.service.binder import Binder
from allocator.service.cache.store import ClusterCache
from allocator.service.coreadapter import CoreAdapter
from allocator.service.events import EventRecorder
from allocator.service.gang_hooks import GangHooks
from allocator.service.metrics import Metrics


class ServiceView(Protocol):
    core: CoreAdapter
    cache: ClusterCache
    binder: Binder
    gang: GangHooks | None
    events: EventRecorder | None
    metrics: Metrics

    @property
    def synced(self) -> bool: ...

    def health_problem(self) -> str: ...

    def not_ready_reasons(self) -> list[str]: ...
