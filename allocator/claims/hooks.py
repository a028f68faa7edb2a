"""DRA claim allocation as a component of the allocator process (allocator/runtime/component.py):
the claims controller fed by the watch cache, and the admission route that gates pods at creation.
allocator/assembly.py builds `DraClaims`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from allocator.claims.cache_view import ClaimsCache
from allocator.claims.controller import ClaimsController
from allocator.claims.webhook import CLAIMS_PATH, PATH, claim_reviewer, reviewer
from allocator.runtime.admission import Reviewer
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.dra_settings import DraSettings
from allocator.runtime.events import EventSink
from allocator.runtime.kube import KubeApi
from allocator.runtime.runner import ControllerMetrics
from allocator.runtime.steering import Steering
from allocator.runtime.tasks import Spawn
from allocator.runtime.topology import Topology


class DraClaims:
    """A `Component`."""

    name = "claims"

    def __init__(
        self,
        settings: DraSettings,
        *,
        api: KubeApi,
        cache: ClaimsCache,
        core: CoreAdapter,
        events: EventSink,
        is_leader: Callable[[], bool],
        synced: Callable[[], bool],
        topology_keys: Sequence[str] = (),
        topology: Topology | None = None,
        metrics: ControllerMetrics | None = None,
        registry: CollectorRegistry | None = None,
        namespace: str = "topoalloc-system",
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.synced = synced
        self.controller = ClaimsController(
            api=api,
            cache=cache,
            core=core,
            settings=settings,
            events=events,
            is_leader=is_leader,
            synced=synced,
            topology_keys=topology_keys,
            topology=topology,
            metrics=metrics,
            registry=registry,
            namespace=namespace,
        )
        self.runner = self.controller.runner

    def observe(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        self.controller.observe(kind, key, obj)

    def routes(self) -> Mapping[str, Reviewer]:
        """The admission routes gating pods whose claims topoalloc allocates, and marking those
        claims at their creation."""
        return {
            PATH: reviewer(self.cache.dra, self.synced, self.settings.scheduler_names),
            CLAIMS_PATH: claim_reviewer(self.cache.dra, self.synced),
        }

    def steering(self) -> Sequence[Steering]:
        return ()

    def start(self, spawn: Spawn) -> None:
        spawn("claims controller", self.runner.run())

    def stop(self) -> None:
        self.runner.stop()
