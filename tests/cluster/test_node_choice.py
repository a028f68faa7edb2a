"""Scenario: a GPU pod that keeps the default scheduler on a cluster whose kube-scheduler knows
nothing of topoalloc (no extender, no topoalloc profile: kube-scheduler restarted with an empty
configuration for this module). kube-scheduler binds it by GPU count onto a node where the real
agent (fixture mode, its node-bound ServiceAccount, RBAC and admission policy) serves the stand-in
kubelet: the agent chooses the pod's devices by topology, writes them into the pod's annotation
with `topoalloc.io/allocated-node`, posts a Normal Event, and the running allocator counts the
devices. A pod whose annotation was made for another node is served the same way and counted only
once the agent rewrote it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.cluster.burst import PLUGIN_RESOURCES, PluginNode, gpu_uuids, start_plugin_node, stop_plugin_node
from tests.cluster.harness import ALLOCATED, ClusterEnv, allocated, gpu_pod, held
from tests.support.cluster_product import scheduler_config
from tests.support.controlplane import wait_until

NODE = "nc-dgx"
ALLOCATED_NODE = "topoalloc.io/allocated-node"
COUNTED = f'topoalloc_allocated_devices{{node="{NODE}",type="gpu"}}'


@pytest.fixture(scope="module")
def node(cluster: ClusterEnv) -> Iterator[PluginNode]:
    plain = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
    cluster.cp.start_scheduler(plain)
    plugin_node = start_plugin_node(cluster, NODE, labels={})
    try:
        cluster.wait_device(NODE)
        plugin_node.kubelet.wait_registered(PLUGIN_RESOURCES, timeout=60)
        yield plugin_node
    finally:
        stop_plugin_node(cluster, plugin_node)
        cluster.cp.start_scheduler(
            scheduler_config(f"https://127.0.0.1:{cluster.extender.port}", cluster.certs)
        )


def _gpus(*minors: int) -> str:
    """A device-allocated annotation of whole GPUs."""
    entries = [{"minor": m, "resources": {"koordinator.sh/gpu-core": "100"}} for m in minors]
    return json.dumps({"gpu": entries}, separators=(",", ":"))


def _written(cluster: ClusterEnv, ns: str, name: str) -> dict:
    return wait_until(
        lambda: (
            (p := cluster.pod(ns, name))["metadata"].get("annotations", {}).get(ALLOCATED_NODE) == NODE and p
        ),
        timeout=30,
        what=f"{name}'s devices written by the agent",
    )


def test_default_scheduler_pod_gets_its_devices_from_the_node(
    cluster: ClusterEnv, ns: str, node: PluginNode
) -> None:
    node.kubelet.forget()
    cluster.create_pod(ns, gpu_pod("plain", gpus=2, node_selector={"kubernetes.io/hostname": NODE}))
    pod = cluster.wait_bound(ns, "plain")
    assert pod["spec"]["nodeName"] == NODE and ALLOCATED not in pod["metadata"].get("annotations", {})
    assert pod["spec"].get("schedulerName") == "default-scheduler"

    got = node.kubelet.admit(pod)["main"]["nvidia.com/gpu"]
    uuid = gpu_uuids(cluster, NODE)
    assert sorted(got.ids) == sorted([uuid[0], uuid[1]])  # two GPUs of one NUMA node

    pod = _written(cluster, ns, "plain")
    assert [(e["minor"], e["id"]) for e in allocated(pod)["gpu"]] == [(0, uuid[0]), (1, uuid[1])]
    event = wait_until(
        lambda: next((e for e in cluster.events(ns) if e["reason"] == "DevicesChosenOnNode"), None),
        timeout=20,
        what="the DevicesChosenOnNode Event",
    )
    assert event["type"] == "Normal" and event["involvedObject"]["name"] == "plain"
    assert f"GPU 0 ({uuid[0]}), GPU 1 ({uuid[1]})" in event["message"]
    # the allocator's cache counts them as it counts its own
    wait_until(
        lambda: held(cluster.leader()).get(COUNTED) == 2, timeout=30, what="the allocator counting 2 GPUs"
    )

    # placed for another node, bound here: served here, counted once rewritten
    elsewhere = {ALLOCATED: _gpus(7), ALLOCATED_NODE: "nc-elsewhere"}
    cluster.create_pod(
        ns, gpu_pod("moved", gpus=1, annotations=elsewhere, node_selector={"kubernetes.io/hostname": NODE})
    )
    moved = cluster.wait_bound(ns, "moved")
    assert moved["metadata"]["annotations"][ALLOCATED_NODE] == "nc-elsewhere"
    # a pod bound after it, placed on GPU 5 of this node: once the allocator counts that one (its
    # watch delivers the pods in order), it has seen "moved" bound, and counts nothing for it
    # (0, 1 and 5, not 7 too)
    marker = gpu_pod("marker", gpus=1, annotations={ALLOCATED: _gpus(5), ALLOCATED_NODE: NODE})
    marker["spec"]["nodeName"] = NODE
    cluster.create_pod(ns, marker)
    wait_until(
        lambda: held(cluster.leader()).get(COUNTED) == 3, timeout=30, what="the allocator counting 3 GPUs"
    )
    got = node.kubelet.admit(moved)["main"]["nvidia.com/gpu"]
    assert got.ids == [uuid[2]]  # beside the pair, not GPU 7
    moved = _written(cluster, ns, "moved")
    assert [e["minor"] for e in allocated(moved)["gpu"]] == [2]
    wait_until(
        lambda: held(cluster.leader()).get(COUNTED) == 4, timeout=30, what="the allocator counting 4 GPUs"
    )
