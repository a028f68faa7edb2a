"""Defragmentation behind the allocator (docs/defragmentation.md): the migration controller on its
runner, told of the watch cache's changes, started and stopped with the process. allocator/assembly.py
builds `Defragmentation` when `defrag.enabled` (and Reservations are on: it reserves rooms)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from allocator.defrag.cache_view import DefragCache
from allocator.defrag.controller import MigrationController
from allocator.defrag.metrics import DefragMetrics
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.defrag_settings import DefragSettings
from allocator.runtime.events import EventSink
from allocator.runtime.kube import KubeApi
from allocator.runtime.runner import ControllerMetrics
from allocator.runtime.tasks import Spawn


class Defragmentation:
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
        budgets_read: Callable[[], bool],
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

    def observe(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        self.controller.observe(kind, key, obj)

    def start(self, spawn: Spawn) -> None:
        spawn("defrag controller", self.controller.runner.run())

    def stop(self) -> None:
        self.controller.runner.stop()
