"""Defragmentation as a component of the allocator process (allocator/runtime/component.py): the
migration controller on its runner (on the leader), told of the watch cache's changes (its own
Reservations, the pods it moves). No route and no steering: its moves reach pods through
Reservations, which the Reservations component steers. allocator/assembly.py builds it when
`defrag.enabled` (and Reservations are on)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from allocator.defrag.cache_view import DefragCache
from allocator.defrag.controller import MigrationController
from allocator.defrag.metrics import DefragMetrics
from allocator.runtime.admission import Reviewer
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.defrag_settings import DefragSettings
from allocator.runtime.events import EventSink
from allocator.runtime.kube import KubeApi
from allocator.runtime.runner import ControllerMetrics
from allocator.runtime.steering import Steering
from allocator.runtime.tasks import Spawn

JSON = dict[str, Any]


class Defragmentation:
    """A `Component`."""

    name = "defrag"

    def __init__(
        self,
        settings: DefragSettings,
        *,
        api: KubeApi,
        cache: DefragCache,
        core: CoreAdapter,
        registry: CollectorRegistry,
        events: EventSink,
        is_leader: Callable[[], bool],
        synced: Callable[[], bool],
        namespace: str,
        budgets_read: Callable[[], bool] = lambda: True,
        controllers: ControllerMetrics | None = None,
    ) -> None:
        self.controller = MigrationController(
            api=api,
            cache=cache,
            core=core,
            settings=settings,
            events=events,
            metrics=DefragMetrics(registry),
            is_leader=is_leader,
            synced=synced,
            namespace=namespace,
            budgets_read=budgets_read,
            controller_metrics=controllers,
        )

    def routes(self) -> Mapping[str, Reviewer]:
        return {}

    def steering(self) -> Sequence[Steering]:
        return ()

    def observe(self, kind: str, key: str, obj: JSON | None) -> None:
        self.controller.observe(kind, key, obj)

    def start(self, spawn: Spawn) -> None:
        spawn("defrag controller", self.controller.runner.run())

    def stop(self) -> None:
        self.controller.runner.stop()
