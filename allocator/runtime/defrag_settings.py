"""Settings of defragmentation by safe rescheduling (the `defrag:` block of the allocator's config,
docs/defragmentation.md). Off by default; when turned on, a dry run until `dryRun: false`."""

from __future__ import annotations

from dataclasses import dataclass

# Checked below and written into the chart's schema (config key -> field): periods must be more
# than 0 seconds, caps 0 or more.
PERIODS = {"interval": "interval", "window": "window", "reserveTimeout": "reserve_timeout"}
CAPS = {
    "maxMovesPerPlan": "max_moves_per_plan",
    "maxMigrating": "max_migrating",
    "maxMigratingPerNamespace": "max_migrating_per_namespace",
    "maxMigratingPerWorkload": "max_migrating_per_workload",
    "maxPerWindow": "max_per_window",
}


@dataclass
class DefragSettings:
    enabled: bool = False
    dry_run: bool = True  # plan and report (Events, the report ConfigMap); reserve and evict nothing
    interval: float = 30.0  # seconds between passes of the migration controller
    # Only work waiting at least this long is planned for (a pod pending for a moment is not stuck).
    min_wait: float = 60.0
    allow_bare_pods: bool = False  # pods no controller recreates may move too
    proactive: bool = False  # with nothing waiting, clear the cheapest node (pods below proactivePriority)
    proactive_priority: int = 0
    max_moves_per_plan: int = 8
    # Limits (Koordinator's MigrationController's): moves in flight in the cluster, per namespace,
    # per workload (the pod's controller), and moves started per window.
    max_migrating: int = 2
    max_migrating_per_namespace: int = 2
    max_migrating_per_workload: int = 1
    max_per_window: int = 10
    window: float = 3600.0
    # A move's Reservation not Available this long after it was made is given up (nothing evicted).
    reserve_timeout: float = 300.0
    # The dry run's report: a ConfigMap in the allocator's namespace ("" writes none).
    report_config_map: str = "topoalloc-defrag-report"

    def __post_init__(self) -> None:
        # A zero period would spin the controller; a negative cap means nothing anyone could want.
        for key, name in PERIODS.items():
            seconds = getattr(self, name)
            if seconds <= 0:
                raise ValueError(f"defrag.{key}: expected a positive number of seconds, got {seconds}")
        for key, name in CAPS.items():
            cap = getattr(self, name)
            if cap < 0:
                raise ValueError(f"defrag.{key}: expected 0 or more, got {cap}")
