"""Gang wait with departures on a hand-built stream: a gang waits for a pod to leave, another never
fits, lone pods that fit nowhere are dropped."""

from __future__ import annotations

import math
import random

from simulator.cluster import RequestFactory, SimCluster
from simulator.engine import POLICIES
from simulator.gang_planner import Gang
from simulator.gang_wait import GangWaits, exponential_lifetime, format_gang_waits, replay_queued
from simulator.nodes import fixture_objects
from simulator.objects import pod_object
from simulator.runner import workload_setup

FACTORY = RequestFactory()


def pod(name: str, gpus: int = 0) -> object:
    requests = {"cpu": "1", "memory": "1Gi"}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    return FACTORY.request(pod_object(name, requests), gang=name.split("-")[0] if "-" in name else "")


def gang(name: str, members: int, gpus: int) -> Gang:
    return Gang(name, tuple(pod(f"{name}-{i}", gpus) for i in range(members)))  # type: ignore[misc]


def test_a_gang_waits_for_a_departure_and_another_never_fits() -> None:
    cluster = SimCluster([fixture_objects("l40s-8x-pcie", "n")])
    policy = POLICIES["bestfit"](workload_setup(cluster.size, 1), None)  # type: ignore[arg-type]
    stream = [pod("big", 8), gang("g", 2, 4), pod("cpu1"), pod("lost", 1), gang("h", 2, 8)]
    # every placement lives 3 ticks: "big" (tick 0) leaves at tick 3, when "g" (arrived at 1) fits
    waits = replay_queued(cluster, stream, policy, lambda: 3)  # type: ignore[arg-type]
    assert waits.waits == [2]  # "g": arrived at tick 1, bound at tick 3
    assert waits.never == 1  # "h" needs 16 GPUs of a node with 8
    assert "lost" not in "".join(cluster.core.pod_node)  # 1 GPU at tick 3: none free, dropped
    assert {cluster.core.pod_node[f"sim/g-{i}"] for i in range(2)} == {"n"}


def test_a_gang_placed_on_arrival_waits_zero() -> None:
    cluster = SimCluster([fixture_objects("l40s-8x-pcie", "n")])
    policy = POLICIES["topoalloc"](workload_setup(cluster.size, 1), None)  # type: ignore[arg-type]
    waits = replay_queued(cluster, [gang("g", 2, 2)], policy, exponential_lifetime(5, random.Random(1)))  # type: ignore[list-item]
    assert waits.waits == [0] and waits.never == 0
    assert waits.percentile(99) == 0.0 and math.isnan(GangWaits().percentile(50))


def test_the_table_pools_seeds() -> None:
    text = format_gang_waits({"fgd": [GangWaits([0, 4], 1), GangWaits([10], 0)]}, 600)
    row = next(line for line in text.splitlines() if line.startswith("fgd"))
    assert row.split()[1:4] == [
        "3",
        "4.0",
        "9.9",
    ]  # p99 of 0, 4, 10 interpolated: 4 + 0.98 × 6 and "0.5 ± 0.7" in row


def test_the_same_runs_count_the_gpu_sets_of_what_was_placed() -> None:
    """A DGX H100: a 4-GPU pod and a 2 x 2-GPU gang get NVLink sets; the table prints the shares
    of the runs whose waits it reports (no 8-GPU pod placed: NaN, not 0)."""
    cluster = SimCluster([fixture_objects("dgx-h100", "d")])
    policy = POLICIES["topoalloc"](workload_setup(cluster.size, 1), None)  # type: ignore[arg-type]
    stream = [pod("four", 4), gang("g", 2, 2), pod("one", 1)]
    waits = replay_queued(cluster, stream, policy, lambda: 50)  # type: ignore[arg-type]
    assert waits.waits == [0]
    q = waits.quality
    assert (q.placed(4), q.placed(2), q.placed(8)) == (1, 2, 0)  # the 1-GPU pod has no set to rate
    text = format_gang_waits({"topoalloc": [waits]}, 50)
    row = next(line for line in text.splitlines() if line.startswith("topoalloc"))
    assert "100.0 / 100.0 / nan" in row
