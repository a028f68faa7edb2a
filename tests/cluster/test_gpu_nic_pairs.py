"""Scenario: GPU + RDMA pairs from kube-scheduler to the containers. Eight pods, each asking for one
`nvidia.com/gpu` and one `koordinator.sh/rdma`, fill a DGX H100 node at once; the allocator picks
each pod's GPU and the VF of the NIC beside it together. The node's real agent serves a stand-in
kubelet that admits the pods in a random order among same-second ones (tests/cluster/burst.py): kubelet
allocates the GPU and the NIC in separate calls, and each container must still get exactly its own
pod's pair (GPU UUID, the PF's IDs, the VF's address for SR-IOV CNI), never a GPU from one pod and a
NIC from another."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agent.deviceplugin.inventory import base_of
from tests.cluster.burst import (
    BurstKubelets,
    PluginNode,
    device_ids,
    start_plugin_node,
    stop_plugin_nodes,
    wait_plugin_node,
)
from tests.cluster.harness import ALLOCATED, ClusterEnv, gpu_pod

POOL = {"topoalloc.test/pool": "pairs"}
PODS = 8
GPU = "nvidia.com/gpu"
RDMA = "koordinator.sh/rdma"


@pytest.fixture(scope="module")
def node(cluster: ClusterEnv) -> Iterator[PluginNode]:
    started = start_plugin_node(cluster, "pairs-0", labels=POOL)
    try:
        wait_plugin_node(cluster, started)
        yield started
    finally:
        stop_plugin_nodes(cluster, [started])


def _pair(pod: dict[str, Any], gpus: dict[int, str], nics: dict[int, str]) -> tuple[str, str, str]:
    """(GPU UUID, PF address, the address SR-IOV CNI gets) from the pod's annotation."""
    ann = json.loads(pod["metadata"]["annotations"][ALLOCATED])
    [gpu] = ann["gpu"]
    [nic] = ann["rdma"]
    vfs = [vf["busID"] for vf in (nic.get("extension") or {}).get("vfs") or []]
    pf = nics[int(nic["minor"])]
    return gpus[int(gpu["minor"])], pf, ",".join(vfs) or pf


def test_each_container_gets_its_own_gpu_and_nic(cluster: ClusterEnv, ns: str, node: PluginNode) -> None:
    gpus, nics = device_ids(cluster, node.name, "gpu"), device_ids(cluster, node.name, "rdma")
    kubelets = BurstKubelets(cluster.cp, ns, {node.name: node.kubelet})
    try:

        def create(i: int) -> None:
            body = gpu_pod(f"pair-{i}", gpus=1, resources={RDMA: "1"}, node_selector=POOL)
            cluster.cp.admin.post(f"/api/v1/namespaces/{ns}/pods", body)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(PODS)))
        times = kubelets.wait_admitted(PODS, timeout=90)
    finally:
        kubelets.close()

    pairs = set()
    for name, t in sorted(times.items()):
        assert not t.error, f"{name}: {t.error}"
        uuid, pf, cni = _pair(t.pod, gpus, nics)
        got = t.granted["main"]
        assert got[GPU].ids == [uuid], name
        assert got[GPU].envs == {"NVIDIA_VISIBLE_DEVICES": uuid}, name
        assert [base_of(RDMA, i) for i in got[RDMA].ids] == [pf], name
        assert got[RDMA].envs == {"PCIDEVICE_KOORDINATOR_SH_RDMA": cni}, name
        pairs.add((uuid, cni))
    assert len(pairs) == PODS  # eight different GPUs, eight different VFs
    assert len({g for g, _ in pairs}) == PODS and len({c for _, c in pairs}) == PODS
