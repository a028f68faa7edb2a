"""Prometheus metrics of gang scheduling, on the allocator's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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

    def count(self, metric: str, label: str = "", by: int = 1) -> None:
        """One of the counters the gang lifecycle names (allocator/core/gang/actions.py `Count`)."""
        counters = {
            "plans": self.plans,
            "timeouts": self.timeouts,
            "preemptions": self.preemptions,
            "victims": self.victims,
        }
        counter = counters[metric]
        (counter.labels(label) if label else counter).inc(by)

    def observe_pass(self, waiting_reasons: list[str], held_devices: int) -> None:
        """What one controller pass saw: why each waiting gang waits, devices held while preempting."""
        self.waiting_gangs.clear()
        for reason in set(waiting_reasons):
            self.waiting_gangs.labels(reason).set(waiting_reasons.count(reason))
        self.held_devices.set(held_devices)
