"""Prometheus metrics of gang scheduling, on the allocator's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from allocator.core.gang.actions import DURATION, HELD_DEVICES, WAITING_GANGS, WAITING_PODS

# From the moment a gang has its minimum of members to the moment that many are bound: seconds
# when the cluster has room, up to the gang's timeout when it waits for room.
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class GangMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.duration = Histogram(
            "topoalloc_podgroup_scheduling_duration_seconds",
            "Time from a gang having its minimum of members to that many members bound.",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.timeouts = Counter(
            "topoalloc_podgroup_scheduling_timeout",
            "Gangs that failed because no placement was found within their timeout.",
            registry=registry,
        )
        self.waiting = Gauge(
            "topoalloc_podgroup_waiting_pods",
            "Gang members held back (gated) because their gang has no placement yet.",
            registry=registry,
        )
        self.plans = Counter(
            "topoalloc_podgroup_plans",
            "Gang placements reserved, by outcome of the attempt.",
            ["result"],
            registry=registry,
        )
        self.preemptions = Counter(
            "topoalloc_gang_preemptions",
            "Gangs that evicted lower-priority pods to make room, by outcome.",
            ["result"],
            registry=registry,
        )
        self.victims = Counter(
            "topoalloc_gang_preemption_victims",
            "Pods planned as victims to make room for a waiting gang.",
            registry=registry,
        )
        self.held_devices = Gauge(
            "topoalloc_gang_held_devices",
            "Devices held for gangs that wait for their victims to leave.",
            registry=registry,
        )
        self.waiting_gangs = Gauge(
            "topoalloc_gangs_waiting",
            "Gangs waiting for a placement, by the reason of their Waiting condition.",
            ["reason"],
            registry=registry,
        )

    def count(self, metric: str, label: str = "", by: float = 1) -> None:
        """One of the counters the gang lifecycle names (allocator/core/gang/actions.py)."""
        counters = {
            "plans": self.plans,
            "timeouts": self.timeouts,
            "preemptions": self.preemptions,
            "victims": self.victims,
        }
        counter = counters[metric]
        (counter.labels(label) if label else counter).inc(by)

    def observe(self, metric: str, value: float, label: str = "") -> None:
        """One of the observations the gang lifecycle names (allocator/core/gang/actions.py)."""
        if metric == DURATION:
            self.duration.observe(value)
        elif metric == WAITING_PODS:
            self.waiting.set(value)
        elif metric == HELD_DEVICES:
            self.held_devices.set(value)
        elif metric == WAITING_GANGS:
            self.waiting_gangs.labels(label).set(value)

    def new_pass(self) -> None:
        """A pass's gauges replace the last pass's: a reason no gang waits for any more goes."""
        self.waiting_gangs.clear()
