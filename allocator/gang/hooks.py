"""Gang scheduling behind the extender's one seam (`GangHooks`, allocator/extender/gang_hooks.py,
implemented structurally: this package never imports the extender): the member index fed by the
watch cache, the plan holds, the steering of the extender's verbs, the controller and the
admission webhook. allocator/assembly.py builds `GangScheduling` and plugs it in."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from aiohttp import web
from prometheus_client import CollectorRegistry

from allocator.core.gang.plan import GangPlanSettings
from allocator.gang.cabundle import CaBundleInjector
from allocator.gang.cache_view import GangCache
from allocator.gang.controller import GangController
from allocator.gang.holds import PlanHolds
from allocator.gang.index import GangIndex
from allocator.gang.metrics import GangMetrics
from allocator.gang.steering import GangSteering
from allocator.gang.topology import Topology
from allocator.gang.webhook import webhook_app
from allocator.runtime.coreadapter import CoreAdapter, FilterVerdicts, PodRequest, Rejection
from allocator.runtime.events import EventSink
from allocator.runtime.gang_settings import WEBHOOK_SERVICE, GangSettings
from allocator.runtime.kube import KubeApi
from allocator.runtime.runner import ControllerMetrics
from allocator.runtime.tasks import Spawn
from allocator.runtime.tls import ReloadingTLS, TLSFiles


class GangScheduling:
    """Implements `GangHooks`."""

    def __init__(
        self,
        settings: GangSettings,
        *,
        api: KubeApi,
        cache: GangCache,
        core: CoreAdapter,
        registry: CollectorRegistry,
        events: EventSink,
        is_leader: Callable[[], bool],
        synced: Callable[[], bool],
        tls_files: TLSFiles,
        controllers: ControllerMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.index = GangIndex()
        self.metrics = GangMetrics(registry)
        self.holds = PlanHolds(cache.ledger)
        self.topology = Topology(settings, cache)
        self.steering = GangSteering(
            core, self.holds, self.index, settings, self.topology, lambda g: self.controller.making_room(g)
        )
        plan_settings = GangPlanSettings(
            topology_keys=tuple(settings.topology_keys), scoring=core.scoring.device_scoring
        )
        self.controller = GangController(
            api=api,
            cache=cache,
            core=core,
            holds=self.holds,
            index=self.index,
            settings=settings,
            metrics=self.metrics,
            events=events,
            is_leader=is_leader,
            synced=synced,
            plan_settings=plan_settings,
            topology=self.topology,
            controller_metrics=controllers,
        )
        # The API server presents no client certificate to webhooks: same certificate, no mTLS.
        self.tls = ReloadingTLS(tls_files, client_certs=False)
        self.is_leader = is_leader
        self.ca_bundle = (
            CaBundleInjector(api, settings.webhook_configuration, WEBHOOK_SERVICE, tls_files.client_ca)
            if settings.webhook_configuration
            else None
        )

    # -- GangHooks ------------------------------------------------------------------------------

    def steer_filter(self, req: PodRequest, names: Sequence[str]) -> FilterVerdicts | None:
        steered = self.steering.filter(req, names)
        if steered is not None:
            return FilterVerdicts.from_rejections(*steered)
        return self.steering.job_group_filter(req, names)

    def steer_scores(self, req: PodRequest, names: Sequence[str], scores: np.ndarray) -> list[int] | None:
        if not self.steering.adjusts(req):
            return None
        by_name = self.steering.prioritize(req, names, dict(zip(names, scores.tolist(), strict=True)))
        return [by_name.get(name, 0) for name in names]

    def bind_refusal(self, req: PodRequest, node: str) -> Rejection | None:
        return self.steering.bind_refusal(req, node)

    def observe(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        if kind == "Node":
            self.topology.nodes_changed()  # the profile may be detected differently now
        self.index.on_change(kind, key, obj)
        self.controller.runner.wake()

    def webhook(self) -> tuple[web.Application, ssl.SSLContext]:
        s = self.settings
        return webhook_app(s.scheduler_names, plugin_schedulers=s.gang_plugin_schedulers), self.tls.context

    def start(self, spawn: Spawn, reload_interval: float) -> None:
        """The background work; the server listens for the webhook (`webhook`)."""
        spawn("gang controller", self.controller.runner.run())
        spawn("webhook TLS reload", self.tls.watch(reload_interval))
        if self.ca_bundle is not None:
            spawn("webhook caBundle", self._ca_loop(reload_interval))

    async def _ca_loop(self, interval: float) -> None:
        while True:
            if self.is_leader() and self.ca_bundle is not None:
                await self.ca_bundle.sync()
            await asyncio.sleep(max(interval, 1.0))

    def stop(self) -> None:
        self.controller.runner.stop()
