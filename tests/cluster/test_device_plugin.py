"""Scenario: end to end from kube-scheduler to the container. kube-scheduler (with the topoalloc
extender) places a 2-GPU pod and the allocator writes its annotation; the agent process (fixture
mode, its node-bound ServiceAccount, device plugins on) serves the stand-in kubelet, which admits the
pod and receives exactly the annotated GPUs. A pod bound around the scheduler with an annotation
naming a GPU the node lacks is refused with an Event, and a PodResources mismatch rewrites the
annotation, both through the agent's real RBAC and admission policy. (A pod without any annotation
gets devices the node chooses: test_node_choice.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.burst import PLUGIN_RESOURCES, PluginNode, gpu_uuids, start_plugin_node, stop_plugin_node
from tests.cluster.harness import ALLOCATED, ClusterEnv, allocated, gpu_minors, gpu_pod
from tests.support.controlplane import wait_until
from tests.support.kubelet import AdmissionError

NODE = "dp-dgx"


@pytest.fixture(scope="module")
def node(cluster: ClusterEnv) -> Iterator[PluginNode]:
    plugin_node = start_plugin_node(cluster, NODE, labels={})
    try:
        cluster.wait_device(NODE)
        plugin_node.kubelet.wait_registered(PLUGIN_RESOURCES, timeout=60)
        yield plugin_node
    finally:
        stop_plugin_node(cluster, plugin_node)


def test_scheduled_pod_gets_exactly_its_annotated_gpus(
    cluster: ClusterEnv, ns: str, node: PluginNode
) -> None:
    kubelet = node.kubelet
    cluster.create_pod(ns, gpu_pod("pair", gpus=2, node_selector={"kubernetes.io/hostname": NODE}))
    pod = cluster.wait_bound(ns, "pair")
    assert pod["spec"]["nodeName"] == NODE
    minors = gpu_minors(pod)
    assert len(minors) == 2
    uuid = gpu_uuids(cluster, NODE)

    got = kubelet.admit(pod)["main"]["nvidia.com/gpu"]
    assert sorted(got.ids) == sorted(uuid[m] for m in minors)
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": ",".join(e["id"] for e in allocated(pod)["gpu"])}
    # control devices as found under --dev-root; kubelet is told the host's /dev paths
    order = [e["minor"] for e in allocated(pod)["gpu"]]
    assert got.devices == [(f"/dev/nvidia{m}", f"/dev/nvidia{m}", "rw") for m in order] + [
        ("/dev/nvidiactl", "/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rw"),
    ]


def test_refusal_event_and_annotation_fix_through_rbac_and_policy(
    cluster: ClusterEnv, ns: str, node: PluginNode
) -> None:
    kubelet = node.kubelet
    kubelet.forget()  # the earlier tests' pods are deleted: kubelet frees their devices
    # bound around the scheduler, annotated with a GPU the node lacks: refused, with an Event the
    # agent may post
    bad = '{"gpu":[{"minor":9,"resources":{"koordinator.sh/gpu-core":"100"}}]}'
    stray = gpu_pod("stray", gpus=1, annotations={ALLOCATED: bad})
    stray["spec"]["nodeName"] = NODE
    cluster.create_pod(ns, stray)
    pod = wait_until(lambda: cluster.pod(ns, "stray"), timeout=10, what="stray pod")
    with pytest.raises(AdmissionError, match=f"pod {ns}/stray: .*this node has no GPU with minor 9"):
        kubelet.admit(pod)
    event = wait_until(
        lambda: next((e for e in cluster.events(ns) if e["reason"] == "DeviceAllocationRefused"), None),
        timeout=20,
        what="the refusal Event",
    )
    assert event["involvedObject"]["name"] == "stray" and event["type"] == "Warning"
    cluster.delete_pods(ns)
    wait_until(
        lambda: not cluster.cp.admin.get(f"/api/v1/namespaces/{ns}/pods")["items"], timeout=20, what="no pods"
    )

    # a scheduled pod whose kubelet truth then differs: the agent rewrites its annotation
    cluster.create_pod(ns, gpu_pod("one", gpus=1, node_selector={"kubernetes.io/hostname": NODE}))
    one = cluster.wait_bound(ns, "one")
    (minor,) = gpu_minors(one)
    kubelet.admit(one)
    uuid = gpu_uuids(cluster, NODE)
    # the next served Allocate triggers the cross-check 2 s later; meanwhile kubelet's truth for
    # "one" changes (as if another device plugin had served it)
    cluster.create_pod(ns, gpu_pod("two", gpus=1, node_selector={"kubernetes.io/hostname": NODE}))
    kubelet.admit(cluster.wait_bound(ns, "two"))
    held = {i for p in kubelet.allocations.values() for c in p.values() for i in c.get("nvidia.com/gpu", [])}
    other = next(m for m in sorted(uuid) if uuid[m] not in held)
    kubelet.allocations[f"{ns}/one"]["main"]["nvidia.com/gpu"] = [uuid[other]]
    fixed = wait_until(
        lambda: gpu_minors(p := cluster.pod(ns, "one")) == [other] and p,
        timeout=30,
        what="the corrected annotation",
    )
    assert allocated(fixed)["gpu"][0]["id"] == uuid[other]
    assert any(e["reason"] == "DeviceAllocationMismatch" for e in cluster.events(ns))
    assert minor != other
