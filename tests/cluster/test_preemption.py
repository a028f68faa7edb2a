"""Scenario: preemption through the extender on a real control plane. kube-scheduler (the
project's configuration, `preemptVerb: preempt`) cannot place a high-priority pod that needs one
NVLink pair of an A100 node full of low-priority 1-GPU pods; its own dry run picks victims by
count, the allocator's preempt verb answers with two pods that free one pair, kube-scheduler
deletes exactly those, and once they are gone the pod binds to that pair."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from apis import keys
from tests.cluster.harness import ClusterEnv, gpu_minors, gpu_pod
from tests.support.controlplane import wait_until

NODE = "pre-a100"
PAIRS = ({0, 1}, {2, 3})  # the fixture's NVLink partitions


@pytest.fixture(scope="module")
def node(cluster: ClusterEnv) -> Iterator[str]:
    cluster.add_node(NODE, "a100-pcie-4x-nvlink-pairs", gpus=4)
    cluster.wait_device(NODE)
    yield NODE
    cluster.remove_node(NODE)


def priority_class(cluster: ClusterEnv, name: str, value: int) -> None:
    body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}}
    cluster.cp.admin.post("/apis/scheduling.k8s.io/v1/priorityclasses", {**body, "value": value})


def test_kube_scheduler_preempts_the_pods_that_free_one_nvlink_pair(
    cluster: ClusterEnv, ns: str, node: str
) -> None:
    priority_class(cluster, f"{ns}-low", 10)
    priority_class(cluster, f"{ns}-high", 1000)
    here = {"kubernetes.io/hostname": node}
    fillers = {}
    # Fillers land one per GPU; which filler holds which GPU is the allocator's choice.
    for i in range(4):
        pod = gpu_pod(f"f{i}", gpus=1, node_selector=here)
        pod["spec"]["priorityClassName"] = f"{ns}-low"
        cluster.create_pod(ns, pod)
        fillers[f"f{i}"] = gpu_minors(cluster.wait_bound(ns, f"f{i}"))[0]
    big = gpu_pod(
        "big",
        gpus=2,
        node_selector=here,
        annotations={keys.GPU_PARTITION_SPEC: json.dumps({"allocatePolicy": "Restricted"})},
    )
    big["spec"]["priorityClassName"] = f"{ns}-high"
    cluster.create_pod(ns, big)

    def deleted() -> set[str]:
        return {name for name in fillers if cluster.pod(ns, name)["metadata"].get("deletionTimestamp")}

    # kube-scheduler deletes its victims one after another: wait for both.
    victims = wait_until(
        lambda: d if len(d := deleted()) >= 2 else None, timeout=60, what="two victims deleted"
    )
    freed = {fillers[name] for name in victims}
    assert freed in PAIRS, (victims, fillers)  # exactly one NVLink pair, nothing else
    # The choice went through the allocator's preempt verb, not kube-scheduler's count alone.
    # (the leader's: kube-scheduler reaches the Lease holder, which an earlier module may have moved)
    _, metrics = cluster.leader().health("/metrics")
    kept = [
        line
        for line in metrics.splitlines()
        if line.startswith('topoalloc_preemption_nodes_total{answer="kept"}')
    ]
    assert kept and float(kept[0].split()[-1]) >= 1, kept
    # No kubelet: the stand-in for it finishes the victims, then the pod binds to that pair.
    for name in victims:
        cluster.cp.admin.delete(f"/api/v1/namespaces/{ns}/pods/{name}", gracePeriodSeconds=0)
    bound = cluster.wait_bound(ns, "big", timeout=60)
    assert set(gpu_minors(bound)) == freed
    for name in set(fillers) - victims:  # the others were never touched
        pod = cluster.pod(ns, name)
        assert pod["spec"].get("nodeName") == node and not pod["metadata"].get("deletionTimestamp")
