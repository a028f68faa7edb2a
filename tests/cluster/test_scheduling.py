"""Scenario 2: kube-scheduler v1.35 calls the allocator over mutual TLS (the project's
KubeSchedulerConfiguration) and the pods bind with concrete devices: whole GPU, NVLink pair, half
GPU, nvidia.com/gpu, joint GPU+RDMA; an unschedulable pod's pending reason names the cause; no GPU
is given twice."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.cluster.harness import DEVICES, ClusterEnv, allocated, gpu_minors, gpu_pod
from tests.support.controlplane import wait_until

POOL = {"topoalloc.test/pool": "sched"}
DGX, A100, SMALL = "sched-dgx", "sched-a100", "sched-small"


@pytest.fixture(scope="module", autouse=True)
def nodes(cluster: ClusterEnv) -> Iterator[None]:
    cluster.add_node(DGX, "dgx-h100", gpus=8, labels=POOL)
    cluster.add_node(A100, "a100-pcie-4x-nvlink-pairs", gpus=4, labels=POOL)
    cluster.add_node(SMALL, "a100-pcie-4x-no-rdma", gpus=4, labels=POOL)
    for node in (DGX, A100, SMALL):
        cluster.wait_device(node)
    yield
    for node in (DGX, A100, SMALL):
        cluster.remove_node(node)


def on(node: str) -> dict[str, str]:
    return {"kubernetes.io/hostname": node}


def test_whole_gpu(cluster: ClusterEnv, ns: str) -> None:
    cluster.create_pod(ns, gpu_pod("whole", resources={"koordinator.sh/gpu": "100"}, node_selector=on(DGX)))
    pod = cluster.wait_bound(ns, "whole")
    assert pod["spec"]["nodeName"] == DGX
    gpus = allocated(pod)["gpu"]
    assert len(gpus) == 1
    assert gpus[0]["resources"]["koordinator.sh/gpu-core"] == "100"


def test_nvlink_pair(cluster: ClusterEnv, ns: str) -> None:
    cluster.create_pod(ns, gpu_pod("pair", gpus=2, node_selector=on(A100)))
    pod = cluster.wait_bound(ns, "pair")
    # The fixture's NVLink bridges join 0-1 and 2-3; any other pair crosses the sockets.
    assert gpu_minors(pod) in ([0, 1], [2, 3])


def test_half_gpus_share_one_card(cluster: ClusterEnv, ns: str) -> None:
    half = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
    for name in ("half-a", "half-b", "half-c"):
        cluster.create_pod(ns, gpu_pod(name, resources=half, node_selector=on(SMALL)))
    pods = [cluster.wait_bound(ns, name) for name in ("half-a", "half-b", "half-c")]
    used: Counter[int] = Counter()
    for pod in pods:
        (gpu,) = allocated(pod)["gpu"]
        assert gpu["resources"]["koordinator.sh/gpu-core"] == "50"
        used[int(gpu["minor"])] += 50
    # Never more than a whole card on one GPU; two halves fill a card before a third is opened.
    assert max(used.values()) == 100 and sum(used.values()) == 150 and len(used) == 2


def test_nvidia_gpu_counted_by_both(cluster: ClusterEnv, ns: str) -> None:
    cluster.create_pod(ns, gpu_pod("count", gpus=4, node_selector=on(DGX)))
    pod = cluster.wait_bound(ns, "count")
    assert gpu_minors(pod) in ([0, 1, 2, 3], [4, 5, 6, 7])  # one NVSwitch partition of 4
    # kube-scheduler's own NodeResourcesFit counts nvidia.com/gpu too: 5 more do not fit beside 4.
    cluster.create_pod(ns, gpu_pod("too-many", gpus=5, node_selector=on(DGX)))
    cluster.wait_pending_reason(ns, "too-many", r"Insufficient nvidia.com/gpu")


def test_joint_gpu_and_rdma_under_one_switch(cluster: ClusterEnv, ns: str) -> None:
    joint = json.dumps({"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"})
    cluster.create_pod(
        ns,
        gpu_pod(
            "joint",
            resources={"koordinator.sh/gpu": "200", "koordinator.sh/rdma": "200"},
            annotations={"scheduling.koordinator.sh/device-joint-allocate": joint},
            node_selector=on(DGX),
        ),
    )
    pod = cluster.wait_bound(ns, "joint")
    alloc = allocated(pod)
    device = cluster.cp.admin.get(f"{DEVICES}/{DGX}")
    switch = {(d["type"], d["minor"]): d["topology"].get("pcieSwitchID") for d in device["spec"]["devices"]}
    gpu_switches = sorted(switch["gpu", g["minor"]] for g in alloc["gpu"])
    nic_switches = sorted(switch["rdma", r["minor"]] for r in alloc["rdma"])
    assert len(gpu_switches) == 2 and None not in gpu_switches
    assert gpu_switches == nic_switches  # each GPU's NIC on its own PCIe switch (GPUDirect RDMA)


def test_unschedulable_names_the_cause(cluster: ClusterEnv, ns: str) -> None:
    cluster.create_pod(ns, gpu_pod("nine", resources={"koordinator.sh/gpu": "900"}, node_selector=POOL))
    message = cluster.wait_pending_reason(ns, "nine", r"GPU")
    # kube-scheduler's condition carries the extender's per-node reasons.
    assert "need 9 GPUs" in message, message  # more than any node has (issue 31)


def test_no_gpu_given_twice(cluster: ClusterEnv, ns: str) -> None:
    names = [f"one-{i}" for i in range(5)]
    for name in names:  # created back to back: kube-scheduler asks for them in quick succession
        cluster.create_pod(
            ns, gpu_pod(name, resources={"koordinator.sh/gpu": "100"}, node_selector=on(SMALL))
        )

    def bound() -> list[dict]:
        pods = [cluster.pod(ns, name) for name in names]
        return [p for p in pods if p["spec"].get("nodeName")]

    pods = wait_until(lambda: len(b := bound()) >= 4 and b, timeout=90, what="4 of 5 pods bound")
    (left,) = [n for n in names if n not in {p["metadata"]["name"] for p in pods}]
    cluster.wait_pending_reason(ns, left, r"GPU")
    pods = bound()
    assert len(pods) == 4
    minors = [m for pod in pods for m in gpu_minors(pod)]
    assert sorted(minors) == [0, 1, 2, 3], minors
