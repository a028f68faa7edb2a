"""Scenario: a 40-pod gang (PodGroup of either API, 1 nvidia.com/gpu each) fills 5 DGX H100 nodes at
once, from kube-scheduler to the containers. Each node runs the real agent (device plugins on) and a stand-in
kubelet that admits pods as they bind, nodes in parallel (tests/cluster/burst.py). The whole gang
is admitted in a random order among same-second members, every container gets exactly its own
pod's annotated GPU (the agent names the pod from kubelet's PodResources list, not from the order),
none twice, and no annotation needs rewriting afterwards. No timing assertion: the burst's speed is
bench/gang_burst.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from tests.cluster.burst import (
    BurstKubelets,
    PluginNode,
    create_gang,
    gpu_uuids,
    judge,
    rewritten_annotations,
    start_plugin_node,
    stop_plugin_nodes,
    wait_plugin_node,
)
from tests.cluster.gang_sources import (
    NATIVE,
    SCHEDULER_PLUGINS,
    GangSource,
    gang_sources,
)
from tests.cluster.harness import ClusterEnv

POOL = {"topoalloc.test/pool": "burst"}
NODES = 5
MEMBERS = 40

# Gated native members go the way gated scheduler-plugins members go: two sources cover both ways.
pytestmark = gang_sources(SCHEDULER_PLUGINS, NATIVE)


@pytest.fixture(scope="module")
def nodes(cluster: ClusterEnv) -> Iterator[list[PluginNode]]:
    started: list[PluginNode] = []
    try:
        for i in range(NODES):
            started.append(start_plugin_node(cluster, f"burst-{i}", labels=POOL))
        for node in started:
            wait_plugin_node(cluster, node)
        yield started
    finally:
        stop_plugin_nodes(cluster, started)


def test_forty_pod_gang_admitted_whole_with_the_annotated_gpus(
    cluster: ClusterEnv, ns: str, nodes: list[PluginNode], gang_source: GangSource
) -> None:
    uuids = {n.name: gpu_uuids(cluster, n.name) for n in nodes}
    kubelets = BurstKubelets(cluster.cp, ns, {n.name: n.kubelet for n in nodes})
    try:
        create_gang(cluster.cp, ns, "burst", MEMBERS, 1, POOL, gang_source)
        times = kubelets.wait_admitted(MEMBERS, timeout=90)
    finally:
        kubelets.close()

    assert len(times) == MEMBERS
    verdict = judge(times, uuids)
    assert verdict.bad == [], verdict.bad
    # 40 x 1 GPU on 5 x 8 GPUs: every GPU of every node, each once.
    assert Counter(t.node for t in times.values()) == {n.name: 8 for n in nodes}
    for t in times.values():
        got = t.granted["main"]["nvidia.com/gpu"]
        assert len(got.ids) == 1
        assert got.envs == {"NVIDIA_VISIBLE_DEVICES": got.ids[0]}
    # The agents' PodResources cross-check rewrites any annotation that differs from what kubelet
    # assigned: given its time, it must find nothing.
    assert rewritten_annotations(cluster.cp, ns, times) == []
    assert [e for e in cluster.events(ns) if e["reason"] == "DeviceAllocationMismatch"] == []
    for node in nodes:  # the namespace's pods go with it: the next source's gang starts on empty kubelets
        node.kubelet.forget()
