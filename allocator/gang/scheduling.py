"""Gang scheduling wired into a running allocator: the member index fed by the watch cache, the
extender hooks, the controller and the admission webhook's HTTPS listener."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from allocator.core.gang.plan import PlanSettings
from allocator.gang.cabundle import CaBundleInjector
from allocator.gang.config import WEBHOOK_SERVICE, GangSettings
from allocator.gang.controller import GangController
from allocator.gang.extender import GangSteering
from allocator.gang.index import GangIndex
from allocator.gang.metrics import GangMetrics
from allocator.gang.webhook import webhook_app
from allocator.service.cache.store import ClusterCache
from allocator.service.events import EventRecorder
from allocator.service.kube import KubeApi
from allocator.service.tls import ReloadingTLS, TLSFiles

Spawn = Callable[[str, Coroutine[Any, Any, None]], None]


class GangScheduling:
    def __init__(
        self,
        settings: GangSettings,
        *,
        api: KubeApi,
        cache: ClusterCache,
        registry: CollectorRegistry,
        events: EventRecorder | None,
        is_leader: Callable[[], bool],
        synced: Callable[[], bool],
        tls_files: TLSFiles,
    ) -> None:
        self.settings = settings
        self.index = GangIndex()
        self.metrics = GangMetrics(registry)
        self.steering = GangSteering(cache, self.index, settings)
        plan_settings = PlanSettings(
            topology_keys=tuple(settings.topology_keys), scoring=cache.core.scoring.device_scoring
        )
        self.controller = GangController(
            api=api,
            cache=cache,
            index=self.index,
            settings=settings,
            metrics=self.metrics,
            events=events,
            is_leader=is_leader,
            synced=synced,
            plan_settings=plan_settings,
        )
        cache.listeners.append(self._on_change)
        cache.gang_guard = self.steering.guard
        # The API server presents no client certificate to webhooks: same certificate, no mTLS.
        self.tls = ReloadingTLS(tls_files, client_certs=False)
        self.is_leader = is_leader
        self.ca_bundle = (
            CaBundleInjector(api, settings.webhook_configuration, WEBHOOK_SERVICE, tls_files.client_ca)
            if settings.webhook_configuration
            else None
        )

    def _on_change(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        self.index.on_change(kind, key, obj)
        self.controller.wake()

    def webhook_app(self) -> web.Application:
        return webhook_app(self.settings.scheduler_names)

    def start(self, spawn: Spawn, reload_interval: float) -> None:
        """The background work; the server listens for the webhook (`webhook_app`, `tls`)."""
        spawn("gang controller", self.controller.run())
        spawn("webhook TLS reload", self.tls.watch(reload_interval))
        if self.ca_bundle is not None:
            spawn("webhook caBundle", self._ca_loop(reload_interval))

    async def _ca_loop(self, interval: float) -> None:
        while True:
            if self.is_leader() and self.ca_bundle is not None:
                await self.ca_bundle.sync()
            await asyncio.sleep(max(interval, 1.0))

    def stop(self) -> None:
        self.controller.step_down()
