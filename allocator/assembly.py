"""The allocator process wired: the runtime (watch cache, leader election, events, TLS, the one
admission server), the extender and health servers on top of it, and the components the config
turns on (allocator/runtime/component.py): gang scheduling, Reservations, DRA claims,
scarce-resource avoidance, defragmentation.

The one module that imports more than one component package, and the extender with them: each
component builds on the runtime alone and brings what the process serves of it (admission routes,
a watch handler, steering of the core's node decisions, background work); the extender sees the
components' steering only as one `SteeringChain` (allocator/runtime/steering.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import logging
from pathlib import Path

from aiohttp import web

from allocator.claims.hooks import DraClaims
from allocator.defrag.component import Defragmentation
from allocator.extender.app import extender_app, health_app
from allocator.extender.binder import Binder
from allocator.gang.hooks import GangScheduling
from allocator.placement.hooks import Placement
from allocator.reservations.hooks import ReservationScheduling
from allocator.runtime.admission_server import AdmissionServer, bound_port
from allocator.runtime.cache.reflector import Backoff, Reflector
from allocator.runtime.cache.store import ClusterCache
from allocator.runtime.component import Component, Components
from allocator.runtime.config import ServiceConfig
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.events import EventRecorder, EventSink, NullEvents
from allocator.runtime.fleet_metrics import FleetCollector
from allocator.runtime.kube import (
    DEVICES,
    DRA_KINDS,
    NATIVE_PODGROUPS,
    NODES,
    PDBS,
    PODGROUPS,
    PODS,
    RESERVATIONS,
    WORKLOADS,
    ApiError,
    KubeApi,
)
from allocator.runtime.leader import LEADER_LABEL, LeaderElector
from allocator.runtime.metrics import Metrics
from allocator.runtime.tls import ClientAllowlist, ReloadingTLS, TLSFiles
from allocator.runtime.topology import Topology
from allocator.scarce.webhook import ScarceAvoidance

log = logging.getLogger(__name__)

# Nodes and Devices first: pods arriving before their node are held until it does, but the
# first LIST is cheaper when the nodes are already there. Reservations before pods: their owners
# then take their share out of rooms already held, never the other way round. The two native gang
# kinds are watched where the server serves them (1.36: PodGroups, 1.35: Workloads; API discovery
# decides). DRA's kinds when claims are allocated.
KINDS = (NODES, DEVICES, RESERVATIONS, PODS, PODGROUPS, NATIVE_PODGROUPS, WORKLOADS, PDBS)


class Allocator:
    """One allocator process: its runtime parts, the extender, and the components the config turns
    on (gang scheduling, Reservations, DRA claims, scarce-resource avoidance, defragmentation),
    started and stopped together."""

    def __init__(self, config: ServiceConfig, api: KubeApi, *, metrics: Metrics | None = None) -> None:
        self.config = config
        self.api = api
        self.metrics = metrics or Metrics()
        self.round_trips = config.round_trips
        self.core = CoreAdapter(config.scoring)
        self.cache = ClusterCache(
            self.core,
            reservation_ttl=config.reservation_ttl,
            metrics=self.metrics,
            outlines=defrag_on(config),
        )
        self.reflectors = [
            Reflector(
                api,
                kind,
                self.cache,
                metrics=self.metrics,
                watch_timeout=config.watch_timeout,
                backoff=Backoff(config.backoff_initial, config.backoff_max),
            )
            for kind in (*KINDS, *(DRA_KINDS if config.dra.enabled else ()))
        ]
        le = config.leader_election
        self.elector = LeaderElector(api, le, on_change=self._leader_changed) if le.enabled else None
        self.events: EventSink = (
            EventRecorder(api, instance=le.identity, window=config.event_window, metrics=self.metrics)
            if config.events
            else NullEvents()
        )
        self.tls_files = TLSFiles(Path(config.tls_cert), Path(config.tls_key), Path(config.client_ca))
        self.tls = ReloadingTLS(
            self.tls_files,
            on_reload=lambda ok: self.metrics.tls_reloads.labels("ok" if ok else "failed").inc(),
        )
        # The topology profile (docs/topology.md), shared by gangs and gangs of Reservations.
        self.topology = Topology(config.gang, self.cache)
        self.cache.listeners.append(
            lambda kind, key, obj: self.topology.nodes_changed() if kind == NODES.name else None
        )
        self.components = Components(build_components(self))
        self.cache.listeners.append(self.components.observe)
        self.steering = self.components.steering()
        self.cache.ledger.guard = self.steering.bind_refusal
        self.binder = Binder(
            api,
            self.cache,
            self.core,
            is_leader=self.is_leader,
            events=self.events,
            steering=self.steering,
            deadline=config.bind_deadline,
        )
        self.allowlist = ClientAllowlist(config.allowed_clients)
        self.metrics.track_allocations(self.cache.allocated_devices)
        self.metrics.registry.register(FleetCollector(self.cache))
        self.metrics.leader.set(0 if self.elector else 1)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._runners: list[web.AppRunner] = []
        # Every component's webhook route on one server; it listens only when there is a route.
        self.admission = AdmissionServer(
            config.admission,
            self.components.routes(),
            api=api,
            tls_files=self.tls_files,
            is_leader=self.is_leader,
            reload_interval=config.tls_reload_interval,
            count=self.metrics.count_review,
        )
        self.metrics.expect_reviews(self.admission.routes)
        self.port = 0  # bound ports, known after start() (config may say 0)
        self.health_port = 0
        self.webhook_port = 0

    def component(self, name: str) -> Component:
        """The component of that name (KeyError when the config turns it off)."""
        for part in self.components:
            if part.name == name:
                return part
        raise KeyError(f"component {name!r} is off")

    # -- state ------------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return all(r.has_synced for r in self.reflectors)

    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def not_ready_reasons(self) -> list[str]:
        reasons = [f"{r.kind.name} cache not synced" for r in self.reflectors if not r.has_synced]
        if not self.is_leader():
            holder = self.elector.holder if self.elector else None
            reasons.append(f"not the leader (leader: {holder or 'unknown'})")
        return reasons

    def health_problem(self) -> str:
        for name, task in self._tasks.items():
            if task.done() and not task.cancelled() and task.exception() is not None:
                return f"{name} stopped: {task.exception()!r}"
        return self.admission.problem()

    def _leader_changed(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)

    async def _label_loop(self) -> None:
        """Keep topoalloc.io/leader on our own pod in step with leadership (retrying on errors)."""
        le = self.config.leader_election
        applied: bool | None = None
        while True:
            want = self.is_leader()
            if want != applied:
                try:
                    await self._label_pod(want)
                    applied = want
                except ApiError as exc:
                    log.warning("labelling pod %s/%s: %s", le.namespace, le.pod_name, exc)
            await asyncio.sleep(min(1.0, le.retry_period / 2))

    async def _label_pod(self, leader: bool) -> None:
        le = self.config.leader_election
        patch = {"metadata": {"labels": {LEADER_LABEL: "true" if leader else None}}}
        await self.api.patch_pod(le.namespace, le.pod_name, patch)

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        for reflector in self.reflectors:
            self._spawn(f"{reflector.kind.name} reflector", reflector.run())
        if self.elector:
            self._spawn("leader election", self.elector.run())
            if cfg.leader_election.label_pod:
                if not cfg.leader_election.pod_name:
                    raise ValueError("leader_election.label_pod needs the pod name (POD_NAME)")
                self._spawn("leader label", self._label_loop())
        if cfg.events:
            self._spawn("event recorder", self.events.run())
        self._spawn("TLS reload", self.tls.watch(cfg.tls_reload_interval))
        self._spawn("reservation expiry", self._expire_loop())
        self._spawn("freeze the synced heap", self._freeze_after_sync())
        self.components.start(self._spawn)
        self.webhook_port = await self.admission.start(self._spawn)

        health = web.AppRunner(health_app(self), access_log=None)
        await health.setup()
        self._runners.append(health)
        site = web.TCPSite(health, cfg.health_host, cfg.health_port)
        await site.start()
        self.health_port = bound_port(site)

        ext = web.AppRunner(extender_app(self, self.allowlist), access_log=None, shutdown_timeout=5.0)
        await ext.setup()
        self._runners.append(ext)
        site = web.TCPSite(ext, cfg.host, cfg.port, ssl_context=self.tls.context, backlog=512)
        await site.start()
        self.port = bound_port(site)
        log.info(
            "extender on https://%s:%d, health and metrics on http://%s:%d",
            cfg.host,
            self.port,
            cfg.health_host,
            self.health_port,
        )
        # The mode must match kube-scheduler's extender block (prioritizeVerb absent for 1): say it.
        log.info("extender round trips: %d (%s)", self.round_trips, ROUND_TRIP_NOTE[self.round_trips])

    def _spawn(self, name: str, coro: object) -> None:
        self._tasks[name] = asyncio.create_task(coro, name=name)  # type: ignore[arg-type]

    async def _expire_loop(self) -> None:
        period = max(0.05, min(5.0, self.config.reservation_ttl / 4))
        while True:
            await asyncio.sleep(period)
            self.cache.ledger.expire()

    async def _freeze_after_sync(self) -> None:
        """Move the first full cache (thousands of nodes, pods, inventories) out of the garbage
        collector's reach: otherwise every full collection walks all of it, a pause of hundreds
        of milliseconds in the middle of some filter call."""
        await self.wait_synced()
        gc.collect()
        gc.freeze()
        _trim_heap()
        log.info("watch cache synced; %d objects frozen out of garbage collection", gc.get_freeze_count())

    async def wait_synced(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(asyncio.gather(*(r.synced.wait() for r in self.reflectors)), timeout)

    async def stop(self) -> None:
        """Stop serving (in-flight requests finish), give the Lease up, stop the background work."""
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()
        await self.admission.stop()
        self.components.stop()
        if self.elector:
            if self.config.leader_election.label_pod and self.elector.is_leader:
                with contextlib.suppress(ApiError):
                    await self._label_pod(False)
            await self.elector.release()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.events.drain(), 2.0)


ROUND_TRIP_NOTE = {
    1: "filter passes the best node alone; kube-scheduler's extender config needs no prioritizeVerb",
    2: "filter passes every node that fits; kube-scheduler's extender config needs prioritizeVerb",
}


def build_components(alloc: Allocator) -> list[Component]:
    """The components the config turns on, in the order their steering is asked (a gang's plan
    before a room's owner)."""
    cfg = alloc.config
    common = {
        "api": alloc.api,
        "cache": alloc.cache,
        "core": alloc.core,
        "events": alloc.events,
        "is_leader": alloc.is_leader,
        "synced": lambda: alloc.synced,
    }
    parts: list[Component] = []
    if cfg.gang.enabled:
        registry = alloc.metrics.registry
        parts.append(
            GangScheduling(
                cfg.gang,
                registry=registry,
                topology=alloc.topology,
                controllers=alloc.metrics.controllers,
                **common,
            )
        )
    if cfg.reservations.enabled:
        parts.append(
            ReservationScheduling(
                cfg.reservations, topology=alloc.topology, metrics=alloc.metrics.controllers, **common
            )
        )
    if cfg.dra.enabled:  # a gang of claims plans as a gang does
        parts.append(
            DraClaims(
                cfg.dra,
                topology_keys=cfg.gang.topology_keys,
                topology=alloc.topology,
                metrics=alloc.metrics.controllers,
                registry=alloc.metrics.registry,
                namespace=cfg.leader_election.namespace,
                **common,
            )
        )
    if cfg.scarce_avoidance.enabled:
        parts.append(ScarceAvoidance(cfg.scarce_avoidance))
    if cfg.placement.enabled:
        parts.append(
            Placement(
                cfg.placement,
                steering=lambda: alloc.steering,
                registry=alloc.metrics.registry,
                own_namespace=cfg.leader_election.namespace,
                metrics=alloc.metrics.controllers,
                **common,
            )
        )
    if defrag_on(cfg):
        pdbs = next(r for r in alloc.reflectors if r.kind is PDBS)
        parts.append(
            Defragmentation(
                cfg.defrag,
                registry=alloc.metrics.registry,
                namespace=cfg.leader_election.namespace,
                budgets_read=lambda: not pdbs.missing,  # unreadable budgets protect every pod
                controllers=alloc.metrics.controllers,
                **common,
            )
        )
    return parts


def defrag_on(cfg: ServiceConfig) -> bool:
    """Defragmentation runs: it moves pods through Reservations, so they must be on too."""
    return cfg.defrag.enabled and cfg.reservations.enabled


def build_allocator(config: ServiceConfig, api: KubeApi, *, metrics: Metrics | None = None) -> Allocator:
    """The allocator as `topoalloc allocator` runs it."""
    return Allocator(config, api, metrics=metrics)


def _trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim; a no-op elsewhere).
    The first LIST decoded every Node, Device and pod at once; once the cache has read them that
    garbage is free, but without this its pages stay in the process's RSS (measured: 110 MB of
    550 at 5,000 nodes)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
