"""CPU-only pods keep off GPU nodes on a real control plane (issue 32): kube-scheduler never asks the
extender about a pod requesting no device, so the allocator's admission route gives such pods a
preferred node affinity away from the nodes the agent labels as GPU nodes. Four GPU nodes (agents
publishing a100-pcie-4x-nvlink-pairs) and two CPU-only nodes of the same size: 12 CPU-only pods all
land on the CPU-only nodes, a pod that opts out spreads onto a GPU node as kube-scheduler alone
would place it, CPU-only pods past the CPU-only nodes' room still land (on GPU nodes), and GPU pods
get no preference and still bin-pack onto one node's NVLink pair."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from allocator.runtime.scarce_settings import DEFAULT_NODE_LABELS
from allocator.scarce.webhook import PREFERRED
from apis import keys
from tests.cluster.harness import ClusterEnv, gpu_minors, gpu_pod
from tests.support.controlplane import wait_until

POOL = {"topoalloc.test/pool": "scarce"}
GPU_NODES = [f"scarce-gpu-{i}" for i in range(4)]
CPU_NODES = ["scarce-cpu-0", "scarce-cpu-1"]
CPU = "8"  # of the nodes' 64: eight pods fill a node
TERM = {
    "weight": 50,
    "preference": {"matchExpressions": [{"key": k, "operator": "DoesNotExist"} for k in DEFAULT_NODE_LABELS]},
}


@pytest.fixture(scope="module", autouse=True)
def nodes(cluster: ClusterEnv) -> Iterator[None]:
    for name in GPU_NODES:
        cluster.add_node(name, "a100-pcie-4x-nvlink-pairs", gpus=4, labels=POOL)
    for name in CPU_NODES:
        cluster.add_node(name, "", gpus=0, labels=POOL, agent=False)
    for name in GPU_NODES:
        cluster.wait_device(name)
        # The label the preference keys on is the agent's own, published with the Device.
        wait_until(
            lambda n=name: (
                keys.GPU_VENDOR in cluster.cp.admin.get(f"/api/v1/nodes/{n}")["metadata"]["labels"]
            ),
            timeout=60,
            what=f"{name} labelled {keys.GPU_VENDOR}",
        )
    yield
    for name in GPU_NODES + CPU_NODES:
        cluster.remove_node(name)


def cpu_pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    # Kept to the module's nodes by a required selector: other modules' nodes stay in the cluster.
    return gpu_pod(name, resources={"cpu": CPU, "memory": "8Gi"}, labels=labels, node_selector=POOL)


def placed(cluster: ClusterEnv, ns: str, names: list[str]) -> dict[str, str]:
    return {name: cluster.wait_bound(ns, name, timeout=90)["spec"]["nodeName"] for name in names}


def preferred(pod: dict[str, Any]) -> list[Any]:
    return ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(PREFERRED) or []


def test_cpu_only_pods_keep_off_gpu_nodes_while_others_have_room(cluster: ClusterEnv, ns: str) -> None:
    first = [f"cpu-{i}" for i in range(12)]
    for name in first:
        cluster.create_pod(ns, cpu_pod(name))
    where = placed(cluster, ns, first)
    assert set(where.values()) <= set(CPU_NODES), where
    assert all(preferred(cluster.pod(ns, name)) == [TERM] for name in first)

    # Opted out, a pod is placed as kube-scheduler alone places it: on the least loaded node, an
    # empty GPU node (the CPU-only nodes still have room for 4 pods).
    cluster.create_pod(ns, cpu_pod("opted-out", labels={keys.SCARCE_AVOIDANCE: "false"}))
    (node,) = placed(cluster, ns, ["opted-out"]).values()
    assert node in GPU_NODES
    assert preferred(cluster.pod(ns, "opted-out")) == []

    # A preference, not a requirement: past the CPU-only nodes' room, CPU-only pods go to GPU nodes.
    more = [f"more-{i}" for i in range(6)]
    for name in more:
        cluster.create_pod(ns, cpu_pod(name))
    where.update(placed(cluster, ns, more))
    per_node = Counter(where.values())
    assert {n: per_node[n] for n in CPU_NODES} == {n: 8 for n in CPU_NODES}, per_node
    assert sum(per_node[n] for n in GPU_NODES) == 2, per_node


def test_gpu_pods_get_no_preference_and_still_bin_pack(cluster: ClusterEnv, ns: str) -> None:
    cluster.create_pod(ns, gpu_pod("gpu-a", gpus=1, node_selector=POOL))
    a = cluster.wait_bound(ns, "gpu-a")
    cluster.create_pod(ns, gpu_pod("gpu-b", gpus=1, node_selector=POOL))
    b = cluster.wait_bound(ns, "gpu-b")
    assert preferred(a) == [] and preferred(b) == []
    # The allocator's default scoring packs the second GPU beside the first, on its NVLink bridge
    # (0-1 or 2-3), instead of opening another node.
    assert a["spec"]["nodeName"] == b["spec"]["nodeName"] in GPU_NODES
    assert sorted(gpu_minors(a) + gpu_minors(b)) in ([0, 1], [2, 3])
