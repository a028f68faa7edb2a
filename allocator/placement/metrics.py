"""Prometheus metrics of placement mode, on the allocator's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from allocator.runtime.metrics import LATENCY_BUCKETS

# The placement lifecycle's results (allocator/core/placement/lifecycle.py).
RESULTS = ("placed", "unplaceable", "preempting", "replaced")


class PlacementMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.placements = Counter(
            "topoalloc_placements",
            "Placement decisions, by result: placed, unplaceable, preempting, replaced.",
            ["result"],
            registry=registry,
        )
        self.admissions = Counter(
            "topoalloc_placement_admissions",
            "Pods the placement route answered, by result: decided (placed at admission, no gate) or "
            "gated (placed later by the controller), and why it was not decided there.",
            ["result", "reason"],
            registry=registry,
        )
        self.write_seconds = Histogram(
            "topoalloc_placement_write_duration_seconds",
            "Time of a placement's writes (nomination, then the recorded allocation and the gate).",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        for result in RESULTS:  # at zero from the start: a rate sees the first placement
            self.placements.labels(result)

    def count(self, metric: str, label: str, by: float = 1) -> None:
        if metric == "placements":
            self.placements.labels(label).inc(by)
