"""Scenario 5: two allocator replicas with leader election on a real Lease. The leader is killed
with SIGKILL in the middle of a burst of pods; the standby takes over within the lease time, and
every pod ends up bound with devices, none given twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.harness import ClusterEnv, gpu_minors, gpu_pod, ready_nodes
from tests.support.cluster_product import lease_holder
from tests.support.controlplane import wait_until

POOL = {"topoalloc.test/pool": "ha"}
NODES = ("ha-a", "ha-b")
LEASE_DURATION = 6.0  # AllocatorReplica's --lease-duration
RETRY_PERIOD = 1.0
BURST = 16  # one GPU each: exactly the pool's 2 x 8


@pytest.fixture(scope="module", autouse=True)
def nodes(cluster: ClusterEnv) -> Iterator[None]:
    with ready_nodes(cluster, dict.fromkeys(NODES, POOL)):
        yield


@pytest.fixture
def standby(cluster: ClusterEnv) -> Iterator[str]:
    """A second replica, ready and not leading; afterwards whichever replica died is restarted, so
    the session keeps a leader and a standby."""
    leader = cluster.leader().identity
    other = "alloc-b" if leader != "alloc-b" else "alloc-a"
    replica = cluster.replicas.get(other)
    if replica is None or not replica.process.alive():
        replica = cluster.start_allocator(other)
    replica.wait_ready()
    assert lease_holder(cluster.cp) == leader
    yield other
    for identity, replica in list(cluster.replicas.items()):
        if not replica.process.alive():
            replica.process.stop()
            cluster.start_allocator(identity)


def test_leader_killed_during_a_burst(cluster: ClusterEnv, ns: str, standby: str) -> None:
    leader = cluster.leader()
    names = [f"b{i:02d}" for i in range(BURST)]

    def create(batch: list[str]) -> None:
        for name in batch:
            cluster.create_pod(ns, gpu_pod(name, resources={"koordinator.sh/gpu": "100"}, node_selector=POOL))

    def bound() -> list[dict[str, Any]]:
        items = cluster.cp.admin.get(f"/api/v1/namespaces/{ns}/pods")["items"]
        return [p for p in items if p["spec"].get("nodeName")]

    # Half the burst, the leader killed as soon as binding is under way, the other half created
    # while no replica leads.
    create(names[: BURST // 2])
    wait_until(lambda: len(bound()) >= 1, timeout=60, what="the burst under way")
    leader.process.kill()
    killed_at = time.monotonic()
    create(names[BURST // 2 :])
    wait_until(lambda: lease_holder(cluster.cp) == standby, timeout=60, what=f"{standby} to take the Lease")
    takeover = time.monotonic() - killed_at
    # client-go's bound: the Lease expires lease_duration after the last renewal, and the standby
    # looks every retry_period (with jitter); 2 s of slack for a loaded machine.
    assert takeover <= LEASE_DURATION + 2 * RETRY_PERIOD + 2.0, f"takeover took {takeover:.1f}s"

    pods = wait_until(lambda: len(b := bound()) == BURST and b, timeout=120, what="all pods bound")
    per_node: dict[str, list[int]] = {}
    for pod in pods:
        minors = gpu_minors(pod)  # every bound pod carries its allocation
        assert len(minors) == 1
        per_node.setdefault(pod["spec"]["nodeName"], []).extend(minors)
    for node, minors in per_node.items():
        assert sorted(minors) == sorted(set(minors)), f"a GPU of {node} given twice: {sorted(minors)}"
    assert sum(len(m) for m in per_node.values()) == BURST
    print(f"takeover after SIGKILL: {takeover:.1f}s (lease {LEASE_DURATION:.0f}s)")


def test_binds_follow_leadership_to_a_live_replica(cluster: ClusterEnv, ns: str, standby: str) -> None:
    """Leadership moves while the old leader lives on as a standby (here: the Lease handed over by
    an admin). kube-scheduler's kept-alive connection still reaches the old leader, whose binds
    answer "not the leader": it must close that connection so the retry reaches the new one."""
    old = cluster.leader()
    new = cluster.replicas[standby]
    cluster.create_pod(ns, gpu_pod("first", resources={"koordinator.sh/gpu": "100"}, node_selector=POOL))
    cluster.wait_bound(ns, "first")  # kube-scheduler now holds a connection to the old leader

    lease_path = "/apis/coordination.k8s.io/v1/namespaces/topoalloc-system/leases/topoalloc-allocator"

    def hand_over() -> bool:
        # The holder renews the Lease every RETRY_PERIOD: a PUT of the one read a moment ago may
        # meet a newer one (409 Conflict), so read it again and retry, as an admin would.
        lease = cluster.cp.admin.get(lease_path)
        lease["spec"]["holderIdentity"] = standby
        cluster.cp.admin.put(lease_path, lease)
        return True

    wait_until(hand_over, timeout=30, what=f"the Lease handed to {standby}")
    wait_until(lambda: new.health("/readyz")[0] == 200, timeout=30, what=f"{standby} leading")
    wait_until(lambda: old.health("/readyz")[0] == 503, timeout=30, what=f"{old.identity} standing by")
    assert old.process.alive()

    cluster.create_pod(ns, gpu_pod("second", resources={"koordinator.sh/gpu": "100"}, node_selector=POOL))
    pod = cluster.wait_bound(ns, "second", timeout=60)
    assert len(gpu_minors(pod)) == 1
