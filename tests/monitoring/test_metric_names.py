"""Every metric an alert of deploy/components/monitoring or a panel of its dashboard names exists in
the code's registries, in the form it is read by (a counter as `_total`, a histogram as `_bucket`,
`_sum` or `_count`), and every query parses as PromQL (promql-parser)."""

from __future__ import annotations

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry

from allocator.defrag.metrics import DefragMetrics
from allocator.gang.metrics import GangMetrics
from allocator.placement.metrics import PlacementMetrics
from allocator.runtime.cache.store import ClusterCache
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.fleet_metrics import FleetCollector
from allocator.runtime.metrics import Metrics
from tests.support import monitoring


def _readable(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for family in registry.collect():
        names |= monitoring.sample_names(family.name, family.type)
    return names


def allocator_names() -> set[str]:
    """The allocator's registry with every component's metrics on it, as allocator/assembly.py
    builds it, and the scrape-time collectors."""
    metrics = Metrics()
    PlacementMetrics(metrics.registry)
    GangMetrics(metrics.registry)
    DefragMetrics(metrics.registry)
    cache = ClusterCache(CoreAdapter())
    metrics.track_allocations(cache.allocated_devices)
    metrics.registry.register(FleetCollector(cache))
    return _readable(metrics.registry)


def agent_names() -> set[str]:
    """The agent's: the process's default registry once its metric modules are imported."""
    import agent.deviceplugin.events
    import agent.metrics  # noqa: F401

    return {n for n in _readable(prometheus_client.REGISTRY) if n.startswith("topoalloc_agent_")}


def test_every_query_parses() -> None:
    queries = monitoring.expressions()
    assert len(queries) >= 7 + 15  # the seven alerts and the dashboard's panels
    for where, expr in queries.items():
        try:
            monitoring.selected_names(expr)
        except ValueError as exc:
            pytest.fail(f"{where}: {exc}")


def test_a_query_that_does_not_parse_is_refused() -> None:
    with pytest.raises(ValueError):
        monitoring.selected_names("sum(rate(topoalloc_placements_total[5m])")


def test_names_are_read_from_every_selector() -> None:
    expr = 'a_total / on() group_left b{x="1"} and sum(rate({__name__="c_bucket"}[5m])) or d offset 5m'
    assert monitoring.selected_names(expr) == {"a_total", "b", "c_bucket", "d"}


def test_every_metric_the_alerts_and_dashboard_name_is_in_the_code() -> None:
    known = allocator_names() | agent_names()
    used = monitoring.used_names()
    missing = {name: sorted(where) for name, where in used.items() if name not in known}
    assert not missing, f"metrics no registry has: {missing}"
    # both halves are read: the agent's metrics are not only the allocator's under another name
    assert any(n.startswith("topoalloc_agent_") for n in used)


def test_a_counter_is_read_as_total_and_a_histogram_by_its_series() -> None:
    known = allocator_names()
    assert "topoalloc_placements_total" in known and "topoalloc_placements" not in known
    assert "topoalloc_extender_request_duration_seconds_bucket" in known
    assert "topoalloc_extender_request_duration_seconds" not in known
    assert "topoalloc_leader" in known and "topoalloc_leader_total" not in known
