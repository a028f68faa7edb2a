"""Both extender modes on the real control plane (docs/service.md, "Round trips"): kube-scheduler
with the project's configuration for that mode (prioritizeVerb absent for one round trip) and the
allocator started with `--round-trips`. In both, pods land where the allocator ranks best (it packs
them onto one node; kube-scheduler's own scoring would spread them) with concrete devices;
with one round trip kube-scheduler never calls prioritize, with two it does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.harness import ClusterEnv, gpu_minors, gpu_pod, ready_nodes

POOL = {"topoalloc.test/pool": "round-trips"}
NODES = ("rt-a", "rt-b", "rt-c")
REQUESTS = "topoalloc_extender_requests_total{"


@pytest.fixture(scope="module", autouse=True)
def nodes(cluster: ClusterEnv) -> Iterator[None]:
    with ready_nodes(cluster, dict.fromkeys(NODES, POOL)):
        yield


@pytest.fixture(params=[1, 2], ids=["one-trip", "two-trips"])
def round_trips(cluster: ClusterEnv, request: pytest.FixtureRequest) -> Iterator[int]:
    cluster.use_round_trips(request.param)
    yield request.param
    cluster.use_round_trips(None)  # the tier's own mode for the tests after this one


def prioritize_calls(cluster: ClusterEnv) -> float:
    status, text = cluster.leader().health("/metrics")
    assert status == 200
    for line in text.splitlines():
        if line.startswith(REQUESTS) and 'verb="prioritize"' in line and 'result="ok"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_pods_land_where_the_allocator_ranks_best_in_either_mode(
    cluster: ClusterEnv, ns: str, round_trips: int
) -> None:
    cluster.create_pod(ns, gpu_pod("first", gpus=2, node_selector={"kubernetes.io/hostname": "rt-b"}))
    assert cluster.wait_bound(ns, "first")["spec"]["nodeName"] == "rt-b"
    before = prioritize_calls(cluster)
    names = [f"next-{i}" for i in range(3)]
    for name, gpus in zip(names, (1, 2, 1), strict=True):
        cluster.create_pod(ns, gpu_pod(name, gpus=gpus, node_selector=POOL))
    pods = [cluster.wait_bound(ns, name) for name in names]
    # The allocator packs them onto one node; kube-scheduler's own scoring (least allocated,
    # balanced) would have spread them over the two emptier nodes.
    (node,) = {p["spec"]["nodeName"] for p in pods}
    held = [gpu_minors(p) for p in (cluster.pod(ns, "first"), *pods) if p["spec"]["nodeName"] == node]
    taken = [m for minors in held for m in minors]
    assert len(taken) == len(set(taken))  # no GPU given twice
    calls = prioritize_calls(cluster) - before
    assert calls == 0 if round_trips == 1 else calls >= len(names)
