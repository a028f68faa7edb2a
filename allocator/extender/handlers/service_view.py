"""What the verbs and the health app read of the running service.

`server.Allocator` is the one implementation; naming it here instead would make the handlers and
the server import each other (the server builds the apps from the handlers)."""

from __future__ import annotations

from typing import Protocol

from allocator.extender.binder import Binder
from allocator.extender.cache_view import ExtenderCache
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.events import EventSink
from allocator.runtime.metrics import Metrics
from allocator.runtime.steering import Steering


class ServiceView(Protocol):
    core: CoreAdapter
    cache: ExtenderCache
    binder: Binder
    steering: Steering  # the components' (gang plans, rooms' owners), in order
    events: EventSink
    metrics: Metrics
    round_trips: int  # 1: filter passes the best node alone; 2: prioritize ranks (config.py)

    @property
    def synced(self) -> bool: ...

    def health_problem(self) -> str: ...

    def not_ready_reasons(self) -> list[str]: ...
