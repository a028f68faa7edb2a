"""Gang scheduling as a component of the allocator process (allocator/runtime/component.py): the
member index fed by the watch cache, the plan holds, the steering of the core's node decisions
(allocator/runtime/steering.py), the gang gate's admission route and the controller. This package
never imports the extender; allocator/assembly.py builds `GangScheduling` and plugs it in."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from allocator.core.gang.plan import GangPlanSettings
from allocator.gang.cache_view import GangCache
from allocator.gang.controller import GangController
from allocator.gang.holds import PlanHolds
from allocator.gang.index import GangIndex
from allocator.gang.metrics import GangMetrics
from allocator.gang.steering import GangSteering
from allocator.gang.webhook import PATH, review_response
from allocator.runtime.admission import Reviewer, on_any_thread
from allocator.runtime.coreadapter import CoreAdapter, FilterVerdicts, PodRequest, Rejection
from allocator.runtime.events import EventSink
from allocator.runtime.gang_settings import GangSettings
from allocator.runtime.kube import KubeApi
from allocator.runtime.runner import ControllerMetrics
from allocator.runtime.steering import Steering
from allocator.runtime.tasks import Spawn
from allocator.runtime.topology import Topology

JSON = dict[str, Any]


class GangScheduling:
    """A `Component`; its `Steering` is itself."""

    name = "gang"

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
        topology: Topology,
        controllers: ControllerMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.index = GangIndex()
        self.metrics = GangMetrics(registry)
        self.holds = PlanHolds(cache.ledger)
        self.topology = topology
        self.steer = GangSteering(
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

    # -- Steering ---------------------------------------------------------------------------------

    def filter(self, pod: JSON, req: PodRequest, names: Sequence[str]) -> FilterVerdicts | None:
        steered = self.steer.filter(req, names)
        if steered is not None:
            return FilterVerdicts.from_rejections(*steered)
        return self.steer.job_group_filter(req, names)

    def scores(
        self, pod: JSON, req: PodRequest, names: Sequence[str], scores: np.ndarray
    ) -> np.ndarray | None:
        if not self.steer.adjusts(req):
            return None
        by_name = self.steer.prioritize(req, names, dict(zip(names, scores.tolist(), strict=True)))
        return np.asarray([by_name.get(name, 0) for name in names], np.int64)

    def bind_refusal(self, req: PodRequest, node: str) -> Rejection | None:
        return self.steer.bind_refusal(req, node)

    # -- Component --------------------------------------------------------------------------------

    def routes(self) -> Mapping[str, Reviewer]:
        s = self.settings
        return {
            # The pod and the settings only: answered on the admission thread.
            PATH: on_any_thread(
                lambda review: review_response(
                    review, s.scheduler_names, plugin_schedulers=s.gang_plugin_schedulers
                )
            )
        }

    def steering(self) -> Sequence[Steering]:
        return (self,)

    def observe(self, kind: str, key: str, obj: JSON | None) -> None:
        self.index.on_change(kind, key, obj)
        self.controller.runner.wake()

    def start(self, spawn: Spawn) -> None:
        spawn("gang controller", self.controller.runner.run())

    def stop(self) -> None:
        self.controller.runner.stop()
