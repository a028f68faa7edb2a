"""Kubernetes' own gangs with kube-scheduler's gang plugin, and topoalloc in the loop (steering, not
gating), on a real control plane:

* no starvation: on v1.35.6 the plugin alone lets a gang of 5 that cannot fit wait at Permit holding
  its nominations, so a gang of 3 that fits stays unbound and is never requeued
  (../shared/reference/real-cluster-facts.md); with topoalloc a member without a plan passes no node,
  so it never reaches Permit: the gang of 3 binds, and the gang of 5 binds once room frees;
* kube-scheduler evaluates a planned gang again and again and rolls it back (one member fails a check
  of kube-scheduler's own): filter is called far more than 10 times per bind, changes nothing, and
  once the gang binds (or is given up) nothing is held and the cache matches one built afresh.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.gang_sources import NATIVE, WORKLOAD, GangSource, gang_events, gang_sources
from tests.cluster.harness import ClusterEnv, gpu_minors, gpu_pod, held, metrics, ready_nodes
from tests.support.cluster_product import AllocatorReplica
from tests.support.controlplane import wait_until

POOL = {"topoalloc.test/pool": "native"}
NODES = ("nat-a", "nat-b")

pytestmark = gang_sources(NATIVE, WORKLOAD)


@pytest.fixture(scope="module", autouse=True)
def nodes(cluster: ClusterEnv) -> Iterator[None]:
    with ready_nodes(cluster, dict.fromkeys(NODES, POOL), "a100-pcie-4x-no-rdma", gpus=4):
        yield


def member(source: GangSource, name: str, group: str, gpus: int = 1, **requests: str) -> dict[str, Any]:
    pod = gpu_pod(name, resources={"koordinator.sh/gpu": str(100 * gpus), **requests}, node_selector=POOL)
    return source.join(pod, group)


def plain(name: str, node: str, **requests: str) -> dict[str, Any]:
    """A pod bound at creation (no scheduler): it takes what it asks for on `node`."""
    pod = gpu_pod(name, resources=requests)
    pod["spec"]["nodeName"] = node
    return pod


def bound(cluster: ClusterEnv, ns: str, names: list[str]) -> bool:
    return all(cluster.pod(ns, n)["spec"].get("nodeName") for n in names)


def filter_calls(replica: AllocatorReplica) -> float:
    return sum(
        v
        for k, v in metrics(replica).items()
        if k.startswith("topoalloc_extender_requests_total{") and 'verb="filter"' in k
    )


def test_a_waiting_gang_never_blocks_a_smaller_one_and_gets_its_turn(
    cluster: ClusterEnv, ns: str, gang_source: GangSource
) -> None:
    source = gang_source
    filler = gpu_pod(
        "filler", resources={"koordinator.sh/gpu": "400"}, node_selector={"kubernetes.io/hostname": NODES[0]}
    )
    cluster.create_pod(ns, filler)
    cluster.wait_bound(ns, "filler")
    five = [f"five-{i}" for i in range(5)]
    three = [f"three-{i}" for i in range(3)]
    source.create(cluster.cp, ns, "five", 5)
    source.create(cluster.cp, ns, "three", 3)
    for name in five:  # 5 GPUs, 4 free: it waits
        cluster.create_pod(ns, member(source, name, "five"))
    wait_until(
        lambda: [
            e
            for e in gang_events(cluster.events(ns), source.kind, "five", "GangWaiting")
            if "no placement" in e["message"]
        ],
        timeout=60,
        what="the gang of 5 waiting for room",
    )
    for name in three:  # 3 GPUs: fits beside the waiting gang
        cluster.create_pod(ns, member(source, name, "three"))
    wait_until(
        lambda: bound(cluster, ns, three), timeout=30, what="the gang of 3 bound while the gang of 5 waits"
    )
    assert not any(cluster.pod(ns, n)["spec"].get("nodeName") for n in five)
    # Room for the gang of 5 (the filler and the gang of 3 finish): it is planned and binds.
    for name in ["filler", *three]:
        cluster.cp.admin.delete(f"/api/v1/namespaces/{ns}/pods/{name}", gracePeriodSeconds=0)
    wait_until(lambda: bound(cluster, ns, five), timeout=60, what="the gang of 5 bound once room freed")


def test_a_rolled_back_gang_takes_many_filter_calls_per_bind_and_leaks_nothing(
    cluster: ClusterEnv, ns: str, gang_source: GangSource
) -> None:
    if gang_source is not NATIVE:
        pytest.skip("kube-scheduler 1.35 leaves a gang waiting at Permit: no retries to count")
    source, leader = gang_source, cluster.leader()
    before = held(leader)
    # A pod that asks for 600Gi of ephemeral storage on either node: kube-scheduler refuses `roll-1`
    # (it wants as much) everywhere while they run; topoalloc's planner does not look at storage.
    for node in NODES:
        cluster.create_pod(ns, plain(f"blocker-{node}", node, **{"ephemeral-storage": "600Gi"}))
    source.create(cluster.cp, ns, "roll", 2)
    calls = filter_calls(leader)
    cluster.create_pod(ns, member(source, "roll-0", "roll"))
    cluster.create_pod(ns, member(source, "roll-1", "roll", **{"ephemeral-storage": "600Gi"}))
    # roll-0 passes its planned node and waits at Permit for roll-1, which fails: the group is rolled
    # back and tried again, each time asking the extender.
    wait_until(lambda: filter_calls(leader) - calls >= 200, timeout=60, what="200 filter calls for the gang")
    planned = held(leader)
    assert planned.get("topoalloc_reservations") == 2, planned  # the plan's holds, nothing more
    assert (
        sum(v for k, v in planned.items() if "allocated_devices" in k)
        - sum(v for k, v in before.items() if "allocated_devices" in k)
        == 2
    ), planned
    assert not bound(cluster, ns, ["roll-0"]) and not bound(cluster, ns, ["roll-1"])
    for node in NODES:
        cluster.cp.admin.delete(f"/api/v1/namespaces/{ns}/pods/blocker-{node}", gracePeriodSeconds=0)
    wait_until(
        lambda: bound(cluster, ns, ["roll-0", "roll-1"]), timeout=60, what="the gang bound once it fits"
    )
    per_bind = (filter_calls(leader) - calls) / 2
    assert per_bind >= 10, per_bind
    pods = [cluster.pod(ns, n) for n in ("roll-0", "roll-1")]
    assert len({p["spec"]["nodeName"] for p in pods}) == 1  # the plan: one node, one GPU each
    assert sorted(m for p in pods for m in gpu_minors(p)) in ([0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3])
    wait_until(lambda: "topoalloc_reservations" not in held(leader), timeout=30, what="no reservation left")
    assert not gang_events(cluster.events(ns), source.kind, "roll", "GangPlanReleased")
    # No drift: a replica that builds its cache from scratch counts exactly the same devices.
    fresh = cluster.start_allocator("alloc-check")
    try:
        fresh.wait_ready("/syncz")
        time.sleep(0.5)  # its Device and Pod lists are in: /syncz
        assert held(fresh) == held(leader), (held(fresh), held(leader))
    finally:
        fresh.process.stop()
        cluster.replicas.pop("alloc-check", None)
