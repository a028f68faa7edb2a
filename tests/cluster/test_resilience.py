"""Scenario 7: the allocator keeps running while kube-apiserver restarts and etcd's history is
compacted. The allocator's watches resume from resourceVersions the new server no longer has
(410 Gone), so it must relist; what changed meanwhile (a pod deleted, a pod bound by someone
else) must be in its cache before it allocates again: no stale allocation afterwards."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.cluster.harness import ALLOCATED, ClusterEnv, gpu_minors, gpu_pod
from tests.support.controlplane import wait_until

NODE = "rs-dgx"
POOL = {"topoalloc.test/pool": "resilience"}


@pytest.fixture(scope="module", autouse=True)
def node(cluster: ClusterEnv) -> Iterator[None]:
    cluster.add_node(NODE, "dgx-h100", gpus=8, labels=POOL)
    cluster.wait_device(NODE)
    yield
    cluster.remove_node(NODE)


def four_gpus(name: str) -> dict:
    return gpu_pod(name, resources={"koordinator.sh/gpu": "400"}, node_selector=POOL)


def test_apiserver_restart_and_compaction_leave_no_stale_allocation(cluster: ClusterEnv, ns: str) -> None:
    cluster.create_pod(ns, four_gpus("before"))
    before = gpu_minors(cluster.wait_bound(ns, "before"))
    others = [m for m in range(8) if m not in before]
    logs_from = {name: len(r.process.text()) for name, r in cluster.replicas.items()}

    cluster.cp.restart_apiserver()
    # While the allocator's watches are still catching up: the pod it placed goes away, and a pod
    # it never placed (bound by hand, with its own allocation) takes the other four GPUs.
    cluster.cp.admin.delete(f"/api/v1/namespaces/{ns}/pods/before", gracePeriodSeconds=0)
    outside = four_gpus("outside")
    outside["spec"]["nodeName"] = NODE
    outside["metadata"]["annotations"][ALLOCATED] = json.dumps(
        {
            "gpu": [
                {
                    "minor": m,
                    "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"},
                }
                for m in others
            ]
        }
    )
    cluster.create_pod(ns, outside)
    cluster.cp.compact_etcd()

    # The allocator comes back to a resynced cache: the freed GPUs are exactly the ones given out,
    # and the hand-bound pod's GPUs are not given again.
    cluster.create_pod(ns, four_gpus("after"))
    after = cluster.wait_bound(ns, "after", timeout=120)
    assert gpu_minors(after) == before, f"got {gpu_minors(after)}, {others} belong to the hand-bound pod"
    cluster.create_pod(ns, four_gpus("no-room"))
    cluster.wait_pending_reason(ns, "no-room", "GPU", timeout=60)

    # It got there by relisting (the old resourceVersions were gone), not by luck, and alive.
    def relisted() -> bool:
        return any(
            "Pod relisted" in r.process.text()[logs_from.get(n, 0) :] for n, r in cluster.replicas.items()
        )

    wait_until(relisted, timeout=30, what="an allocator to relist its Pod cache")
    assert all(r.process.alive() for r in cluster.replicas.values() if r.process.returncode() is None)
    wait_until(lambda: cluster.leader().health("/healthz")[0] == 200, timeout=30, what="a healthy leader")
