"""Placement mode as a component of the allocator process (allocator/runtime/component.py): the
admission route that places GPU pods at creation or gates them, and the controller that places
the gated ones. It steers
nothing of its own: it asks the components' steering (gangs' plans, rooms' owners) as the extender
does. allocator/assembly.py builds `Placement`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from allocator.placement.admit import AdmissionPlacement
from allocator.placement.cache_view import PlacementCache
from allocator.placement.controller import PlacementController
from allocator.placement.door import ClusterDoor
from allocator.placement.metrics import PlacementMetrics
from allocator.placement.webhook import GATE_PATH, PATH, reviewer
from allocator.runtime.admission import Reviewer
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.events import EventSink
from allocator.runtime.kube import KubeApi
from allocator.runtime.placement_settings import PlacementSettings
from allocator.runtime.runner import ControllerMetrics
from allocator.runtime.steering import Steering
from allocator.runtime.tasks import Spawn

JSON = dict[str, Any]


class Placement:
    """A `Component`."""

    name = "placement"

    def __init__(
        self,
        settings: PlacementSettings,
        *,
        api: KubeApi,
        cache: PlacementCache,
        core: CoreAdapter,
        events: EventSink,
        is_leader: Callable[[], bool],
        synced: Callable[[], bool],
        steering: Callable[[], Steering],
        registry: CollectorRegistry,
        own_namespace: str = "",
        metrics: ControllerMetrics | None = None,
    ) -> None:
        """`steering`: the process's steering chain, asked per decision (built after the
        components, this one among them)."""
        self.settings = settings
        self.own_namespace = own_namespace
        self.door = ClusterDoor(cache, core, _Late(steering), preemption=settings.preemption)
        placement_metrics = PlacementMetrics(registry)
        self.controller = PlacementController(
            api=api,
            cache=cache,
            door=self.door,
            settings=settings,
            events=events,
            metrics=placement_metrics,
            is_leader=is_leader,
            synced=synced,
            controller_metrics=metrics,
        )
        self.runner = self.controller.runner
        self.admission = AdmissionPlacement(
            self.door,
            settings,
            placement_metrics,
            admitting=self.controller.admitting,
            refused_by=self.controller.refused_by,
        )

    def routes(self) -> Mapping[str, Reviewer]:
        return {
            PATH: reviewer(self.settings, self.own_namespace, self.admission.patch),
            GATE_PATH: reviewer(self.settings, self.own_namespace),
        }

    def steering(self) -> Sequence[Steering]:
        return ()

    def observe(self, kind: str, key: str, obj: JSON | None) -> None:
        self.controller.observe(kind, key, obj)

    def start(self, spawn: Spawn) -> None:
        spawn("placement controller", self.runner.run())

    def stop(self) -> None:
        self.runner.stop()


class _Late:
    """The steering chain, read when asked (it is built after the components)."""

    def __init__(self, get: Callable[[], Steering]) -> None:
        self.get = get

    def filter(self, *args: Any) -> Any:
        return self.get().filter(*args)

    def scores(self, *args: Any) -> Any:
        return self.get().scores(*args)

    def bind_refusal(self, *args: Any) -> Any:
        return self.get().bind_refusal(*args)
