"""kubelet's Topology Manager on the real control plane: the agent (fixture mode, its node-bound
identity) reads a kubelet configuration with `single-numa-node` and the static CPU manager and
labels its Node through its own RBAC and admission policy; kube-scheduler with the topoalloc
extender places GPU pods there, and the stand-in kubelet, merging device and CPU hints as kubelet
does, admits each with exactly its annotated GPUs. An 8-GPU pod, which no NUMA node of the DGX H100
holds, is not placed, and its scheduling failure says why."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from agent.discovery.sysfs import parse_list
from tests.agent.support import FIXTURES
from tests.cluster.burst import PluginNode, gpu_uuids, start_plugin_node, stop_plugin_node
from tests.cluster.harness import ClusterEnv, gpu_minors, gpu_pod
from tests.support import topology_manager as tm
from tests.support.controlplane import wait_until

NODE = "tm-dgx"
RESERVED = "0-1,112-113"
NUMA = FIXTURES / "dgx-h100" / "sys" / "devices" / "system" / "node"


@pytest.fixture(scope="module")
def node(cluster: ClusterEnv) -> Iterator[PluginNode]:
    config = cluster.workdir / f"{NODE}-kubelet.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kind": "KubeletConfiguration",
                "topologyManagerPolicy": "single-numa-node",
                "cpuManagerPolicy": "static",
                "reservedSystemCPUs": RESERVED,
            }
        )
    )
    agent_config = cluster.workdir / f"{NODE}-agent.yaml"
    agent_config.write_text(
        yaml.safe_dump({"midTier": {"enabled": False}, "kubelet": {"configFile": str(config)}})
    )
    plugin_node = start_plugin_node(cluster, NODE, labels={}, extra_args=("--config", str(agent_config)))
    kubelet = plugin_node.kubelet
    kubelet.topology_policy = tm.SINGLE_NUMA_NODE
    cpus = {n: parse_list((NUMA / f"node{n}" / "cpulist").read_text()) or [] for n in (0, 1)}
    kubelet.cpu_manager = tm.StaticCpus(cpus, reserved=set(parse_list(RESERVED) or []))
    try:
        cluster.wait_device(NODE)
        kubelet.wait_registered(["nvidia.com/gpu"], timeout=60)
        yield plugin_node
    finally:
        stop_plugin_node(cluster, plugin_node)


def test_pods_placed_under_single_numa_node_are_admitted_with_their_gpus(
    cluster: ClusterEnv, ns: str, node: PluginNode
) -> None:
    labels = wait_until(
        lambda: (
            (lb := cluster.cp.admin.get(f"/api/v1/nodes/{NODE}")["metadata"].get("labels", {})).get(
                "node.koordinator.sh/numa-topology-policy"
            )
            and lb
        ),
        timeout=60,
        what="the Topology Manager labels on the Node",
    )
    assert labels["node.koordinator.sh/numa-topology-policy"] == "SingleNUMANode"
    assert labels["topoalloc.io/cpu-manager-policy"] == "static"
    assert labels["topoalloc.io/numa-cpus"] == "0.112.108_1.112.112"
    here = {"kubernetes.io/hostname": NODE}
    guaranteed = {"cpu": "8", "memory": "16Gi"}
    # all 8 GPUs are free, but no NUMA node holds 8: single-numa-node can never admit it
    cluster.create_pod(ns, gpu_pod("eight", gpus=8, resources=guaranteed, node_selector=here))
    message = wait_until(
        lambda: next(
            (
                c.get("message", "")
                for c in (cluster.pod(ns, "eight").get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled" and c.get("status") == "False"
            ),
            "",
        ),
        timeout=60,
        what="the 8-GPU pod's scheduling failure",
    )
    assert "kubelet's Topology Manager (single-numa-node) cannot align" in message, message
    assert not cluster.pod(ns, "eight")["spec"].get("nodeName")
    cluster.cp.admin.delete(f"/api/v1/namespaces/{ns}/pods/eight", gracePeriodSeconds=0)

    uuid = gpu_uuids(cluster, NODE)
    for i, gpus in enumerate((1, 2, 1, 2, 1, 1)):  # NUMA node 0 (4 GPUs) fills, then node 1
        cluster.create_pod(ns, gpu_pod(f"p{i}", gpus=gpus, resources=guaranteed, node_selector=here))
        pod = cluster.wait_bound(ns, f"p{i}")
        got = node.kubelet.admit(pod)["main"]["nvidia.com/gpu"]
        assert sorted(got.ids) == sorted(uuid[m] for m in gpu_minors(pod)), f"p{i}"
        numa = {node.kubelet.plugins["nvidia.com/gpu"].devices[d][1] for d in got.ids}
        assert len(numa) == 1, f"p{i} spans NUMA nodes {numa}"
