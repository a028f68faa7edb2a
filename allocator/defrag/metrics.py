"""Prometheus metrics of the migration controller, on the allocator's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

STEPS = ("planned", "held", "reserved", "evicted", "finished")


class DefragMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.steps = Counter(
            "topoalloc_defrag_moves",
            "Steps of moves: planned (dry run), held (limits), reserved, evicted, finished.",
            ["step"],
            registry=registry,
        )
        self.migrating = Gauge(
            "topoalloc_defrag_migrating",
            "Moves in flight (their Reservations not finished).",
            registry=registry,
        )
        self.largest_block = Gauge(
            "topoalloc_defrag_largest_free_block",
            "The most whole GPUs free on one node, at the last pass.",
            registry=registry,
        )
        self.gpu_hours = Counter(
            "topoalloc_defrag_gpu_hours_lost",
            "GPU-hours of work the evicted pods had run (age times GPUs).",
            registry=registry,
        )
        for step in STEPS:  # at zero from the start: "no move finished" is a series, not an absence
            self.steps.labels(step)
