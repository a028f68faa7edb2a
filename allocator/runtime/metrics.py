"""Prometheus metrics of the allocator service, on a registry per service instance (tests run
several instances in one process; the global registry would mix them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from allocator.runtime.admission import RESULTS as REVIEW_RESULTS
from allocator.runtime.runner import ControllerMetrics

# Extender calls sit on kube-scheduler's critical path: resolve the millisecond range finely.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)

# (node, device type) -> number of devices with anything allocated on them
AllocationCounts = Callable[[], Iterable[tuple[str, str, int]]]


class _AllocatedDevices(Collector):
    """Read at scrape time from the cache, so the request path pays nothing for it."""

    def __init__(self, source: AllocationCounts) -> None:
        self.source = source

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "topoalloc_allocated_devices",
            "Devices with a confirmed or reserved allocation, by node and device type.",
            labels=["node", "type"],
        )
        for node, dtype, count in self.source():
            family.add_metric([node, dtype], count)
        yield family


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "topoalloc_extender_requests",
            "Extender calls answered, by verb and result.",
            ["verb", "result"],
            registry=r,
        )
        self.failures = Counter(
            "topoalloc_extender_failures",
            "Extender calls that failed or rejected the pod, by verb and reason.",
            ["verb", "reason"],
            registry=r,
        )
        self.latency = Histogram(
            "topoalloc_extender_request_duration_seconds",
            "Extender call latency, by verb.",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.node_rejections = Counter(
            "topoalloc_filter_node_rejections",
            "Nodes the filter rejected, by the allocator core's reason code.",
            ["code"],
            registry=r,
        )
        self.cache_synced = Gauge(
            "topoalloc_cache_synced", "1 when the watch cache of a kind has synced.", ["kind"], registry=r
        )
        self.cache_objects = Gauge(
            "topoalloc_cache_objects", "Objects held in the watch cache, by kind.", ["kind"], registry=r
        )
        self.relists = Counter(
            "topoalloc_cache_relists",
            "Full LISTs by the reflector, by kind and cause.",
            ["kind", "cause"],
            registry=r,
        )
        self.watch_errors = Counter(
            "topoalloc_cache_watch_errors", "Failed LIST or WATCH requests, by kind.", ["kind"], registry=r
        )
        self.leader = Gauge("topoalloc_leader", "1 while this instance holds the leader Lease.", registry=r)
        self.ready = Gauge("topoalloc_ready", "1 while /readyz answers 200.", registry=r)
        self.reservations = Gauge(
            "topoalloc_reservations", "Allocations reserved by bind and not yet seen bound.", registry=r
        )
        self.reservations_expired = Counter(
            "topoalloc_reservations_expired", "Reservations dropped because the pod never bound.", registry=r
        )
        self.events = Counter(
            "topoalloc_events",
            "Pod Events: written, aggregated into an earlier one, or failed.",
            ["result"],
            registry=r,
        )
        self.tls_reloads = Counter(
            "topoalloc_tls_reloads", "Certificate reloads, by result.", ["result"], registry=r
        )
        self.client_rejections = Counter(
            "topoalloc_client_rejections", "Requests refused by the client allowlist (403).", registry=r
        )
        self.preemption_nodes = Counter(
            "topoalloc_preemption_nodes",
            "Candidate nodes of kube-scheduler's preempt calls: kept with device-aware victims, or dropped.",
            ["answer"],
            registry=r,
        )
        self.preemption_victims = Counter(
            "topoalloc_preemption_victims",
            "Victims named to kube-scheduler by the preempt verb (path=extender); a gang's evictions "
            "are topoalloc_gang_preemption_victims.",
            ["path"],
            registry=r,
        )
        self.admission_reviews = Counter(
            "topoalloc_admission_reviews",
            "Admission reviews answered, by route and result (allowed, patched, denied, bad_request, "
            "error: the API server then applied the webhook's failurePolicy).",
            ["route", "result"],
            registry=r,
        )
        # The controllers' runners (allocator/runtime/runner.py), one family each, by controller.
        self.controllers = ControllerMetrics(r)

    def track_allocations(self, source: AllocationCounts) -> None:
        self.registry.register(_AllocatedDevices(source))

    def count_review(self, route: str, result: str) -> None:
        self.admission_reviews.labels(route, result).inc()

    def expect_reviews(self, routes: Iterable[str]) -> None:
        """Every route's results at zero from the start, so that an error rate has a series."""
        for route in routes:
            for result in REVIEW_RESULTS:
                self.admission_reviews.labels(route, result)
