"""Scenario: placement mode on a cluster whose kube-scheduler knows nothing of topoalloc (restarted
with an empty configuration for this module: no extender, no second scheduler) and deploy/'s
webhook configuration (placement mode: the placement route, gang webhooks failing closed). GPU pods
keep the default scheduler; the allocator (replicas started with --placement) places them at
admission, pins them and removes the gate; kube-scheduler binds; each node's agent serves its
stand-in kubelet exactly the recorded devices.

Two DGX H100 nodes with agents and stand-in kubelets. Pods: whole GPUs, a shared GPU, joint
GPU+RDMA, and a pod written as Koordinator's documentation writes one (`koordinator.sh/gpu`), each
bound where topoalloc placed it and handed exactly its recorded devices, checked against the
fixture's NVML and sysfs (UUIDs, memory, VF of its PF, PCIe switch of each VF and GPU); a
scheduler-plugins gang bound whole, also when the webhook was down while members were
created; a pod placed where kube-scheduler refuses it (a host port topoalloc does not model) still
runs (a Deployment's pod created anew elsewhere, a bare pod bound elsewhere with devices chosen on
that node); the leader SIGKILLed mid-burst loses nothing and doubles nothing; opted-out pods and
excluded namespaces are not gated."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.burst import PluginNode, gpu_uuids
from tests.cluster.fixture_facts import fixture_facts
from tests.cluster.harness import ClusterEnv, allocated, gpu_pod
from tests.cluster.placement_mode import ALLOCATED_NODE, GATE, placement_mode, recorded
from tests.support.controlplane import wait_until

NODES = ("pl-a", "pl-b")
FACTS = fixture_facts("dgx-h100")  # what the plugin nodes replay: their NVML and sysfs
GPU, KOORD_GPU, CORE, RDMA = (
    "nvidia.com/gpu",
    "koordinator.sh/gpu",
    "koordinator.sh/gpu-core",
    "koordinator.sh/rdma",
)
JOINT, HINT = (
    "scheduling.koordinator.sh/device-joint-allocate",
    "scheduling.koordinator.sh/device-allocate-hint",
)
MIB = 1 << 20
PG = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"


@pytest.fixture(scope="module")
def nodes(cluster: ClusterEnv) -> Iterator[dict[str, PluginNode]]:
    with placement_mode(cluster, NODES) as started:
        yield started


def _admit(nodes: dict[str, PluginNode], cluster: ClusterEnv, pod: dict[str, Any]) -> list[str]:
    """The stand-in kubelet of the pod's node admits it: the GPU IDs its container got."""
    node = nodes[pod["spec"]["nodeName"]]
    got = node.kubelet.admit(pod)["main"]
    return sorted(got["nvidia.com/gpu"].ids) if "nvidia.com/gpu" in got else []


def test_gpu_pods_of_the_default_scheduler_are_placed_and_get_exactly_their_devices(
    cluster: ClusterEnv, ns: str, nodes: dict[str, PluginNode]
) -> None:
    for node in nodes.values():
        node.kubelet.forget()
    created = cluster.create_pod(ns, gpu_pod("pair", gpus=2))
    assert [g["name"] for g in created["spec"]["schedulingGates"]] == [GATE]  # whatever its scheduler
    pod = cluster.wait_bound(ns, "pair")
    node, minors = recorded(pod)
    assert pod["spec"]["nodeName"] == node and pod["spec"].get("schedulerName") == "default-scheduler"
    assert len(minors) == 2 and minors[1] - minors[0] == 1 and minors[0] % 2 == 0  # a pair on one switch
    uuid = gpu_uuids(cluster, node)
    assert _admit(nodes, cluster, pod) == sorted(uuid[m] for m in minors)

    # a second one packs onto the same node, never onto the same GPUs
    cluster.create_pod(ns, gpu_pod("four", gpus=4))
    four = cluster.wait_bound(ns, "four")
    node4, minors4 = recorded(four)
    assert node4 == node and not set(minors4) & set(minors)
    assert _admit(nodes, cluster, four) == sorted(uuid[m] for m in minors4)


def _placed(cluster: ClusterEnv, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    """Create a pod of the default scheduler: gated at admission, then bound by kube-scheduler on
    the node topoalloc chose (the node its allocation was recorded for)."""
    created = cluster.create_pod(ns, body)
    assert [g["name"] for g in created["spec"]["schedulingGates"]] == [GATE]
    pod = cluster.wait_bound(ns, body["metadata"]["name"])
    assert pod["spec"].get("schedulerName") == "default-scheduler"
    assert pod["metadata"]["annotations"][ALLOCATED_NODE] == pod["spec"]["nodeName"]
    return pod


def _units(ids: list[str]) -> Counter[str]:
    """kubelet IDs of a unit resource (`<GPU UUID or PF address>-uNN`) per device they stand for."""
    return Counter(i.rsplit("-u", 1)[0] for i in ids)


def _vfs(entry: dict[str, Any]) -> list[str]:
    return [vf["busID"] for vf in (entry.get("extension") or {}).get("vfs") or []]


def test_a_shared_gpu_gets_its_recorded_gpu_and_share(
    cluster: ClusterEnv, ns: str, nodes: dict[str, PluginNode]
) -> None:
    for node in nodes.values():
        node.kubelet.forget()
    shared = gpu_pod("half", resources={CORE: "50", "koordinator.sh/gpu-memory-ratio": "50"})
    pod = _placed(cluster, ns, shared)
    (entry,) = allocated(pod)["gpu"]
    assert entry["resources"][CORE] == "50"
    got = nodes[pod["spec"]["nodeName"]].kubelet.admit(pod)["main"][CORE]
    gpu = FACTS.gpus[entry["minor"]]
    assert _units(got.ids) == {gpu.uuid: 50}  # half of the recorded GPU, as NVML names it
    assert got.envs == {
        "NVIDIA_VISIBLE_DEVICES": gpu.uuid,
        "CUDA_DEVICE_SM_LIMIT": "50",
        "CUDA_DEVICE_MEMORY_LIMIT_0": f"{gpu.memory * 50 // 100 // MIB}m",  # half its NVML memory
    }
    assert got.devices[0] == (f"/dev/nvidia{gpu.minor}", f"/dev/nvidia{gpu.minor}", "rw")


def test_joint_gpus_and_vfs_are_the_recorded_ones_each_vf_on_its_gpus_switch(
    cluster: ClusterEnv, ns: str, nodes: dict[str, PluginNode]
) -> None:
    for node in nodes.values():
        node.kubelet.forget()
    same_pcie = {
        JOINT: json.dumps({"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"}),
        HINT: json.dumps({"rdma": {"vfSelector": {}}}),
    }
    # Two GPUs with two RDMA units, then four GPUs with one: SamePCIe raises the NICs to one on
    # each GPU's switch (Koordinator's rule), and the container gets every recorded VF.
    for name, gpus, rdma in (("joint", 2, "2"), ("joint4", 4, "1")):
        body = gpu_pod(name, gpus=gpus, resources={RDMA: rdma}, annotations=same_pcie)
        pod = _placed(cluster, ns, body)
        record = allocated(pod)
        minors = sorted(int(g["minor"]) for g in record["gpu"])
        nics = record["rdma"]
        assert len(minors) == gpus and len(nics) == gpus, record
        got = nodes[pod["spec"]["nodeName"]].kubelet.admit(pod)["main"]
        assert sorted(got[GPU].ids) == sorted(FACTS.gpus[m].uuid for m in minors), name
        vfs = [vf for e in nics for vf in _vfs(e)]
        assert len(vfs) == gpus and all(FACTS.physfn(vf) == e["id"] for e in nics for vf in _vfs(e))
        # kubelet's IDs name the recorded NICs: each as many times as it records units, or, where
        # SamePCIe gave more NICs than the request has units (each records the whole request, as
        # Koordinator's annotation does), the request's units from any of them
        units, recorded_units = _units(got[RDMA].ids), {e["id"]: int(e["resources"][RDMA]) for e in nics}
        if sum(recorded_units.values()) == int(rdma):
            assert units == recorded_units, name
        else:
            assert sum(units.values()) == int(rdma) and set(units) <= set(recorded_units), name
        assert got[RDMA].envs == {"PCIDEVICE_KOORDINATOR_SH_RDMA": ",".join(vfs)}, name
        assert [d[0] for d in got[RDMA].devices] == ["/dev/infiniband/rdma_cm"] + [
            f"/dev/infiniband/{u}" for vf in vfs for u in FACTS.uverbs(vf)
        ]
        # by the fixture's sysfs: each VF behind the PCIe switch of one of the pod's GPUs, and
        # each of its GPUs with a VF behind its own switch
        switches = sorted(FACTS.switch(FACTS.gpus[m].bdf) for m in minors)
        assert "" not in switches and sorted(FACTS.switch(vf) for vf in vfs) == switches, name


def test_a_pod_written_as_koordinators_documentation_writes_it_gets_its_gpu_and_vf(
    cluster: ClusterEnv, ns: str, nodes: dict[str, PluginNode]
) -> None:
    """Koordinator's GPU & RDMA joint-allocation example, its annotations (block-scalar JSON, no
    required scope) and resources (`koordinator.sh/gpu: 100`, `koordinator.sh/rdma: 100`) as
    Koordinator's user manual gives them; only `schedulerName: koord-scheduler` left out (no
    Koordinator scheduler runs here: the pod keeps the default scheduler)."""
    for node in nodes.values():
        node.kubelet.forget()
    annotations = {
        JOINT: '{\n  "deviceTypes": ["gpu","rdma"]\n}',
        HINT: '{\n "rdma": {\n   "vfSelector": {}\n }\n}',
    }
    resources = {KOORD_GPU: "100", RDMA: "100"}
    body = gpu_pod("pod-vf01", resources=resources, annotations=annotations)
    body["spec"]["containers"][0]["name"] = "container-vf"
    pod = _placed(cluster, ns, body)
    record = allocated(pod)
    (gpu_entry,) = record["gpu"]
    (nic,) = record["rdma"]
    gpu = FACTS.gpus[gpu_entry["minor"]]
    (vf,) = _vfs(nic)
    got = nodes[pod["spec"]["nodeName"]].kubelet.admit(pod)["container-vf"]
    assert _units(got[KOORD_GPU].ids) == {gpu.uuid: 100}  # the whole recorded GPU
    assert got[KOORD_GPU].envs == {"NVIDIA_VISIBLE_DEVICES": gpu.uuid}
    assert _units(got[RDMA].ids) == {nic["id"]: 100}  # the whole recorded NIC
    assert got[RDMA].envs == {"PCIDEVICE_KOORDINATOR_SH_RDMA": vf}
    assert FACTS.physfn(vf) == nic["id"] and FACTS.switch(vf) == FACTS.switch(gpu.bdf) != ""


def test_a_gang_binds_whole_also_when_the_webhook_was_down_for_some_members(
    cluster: ClusterEnv, ns: str, nodes: dict[str, PluginNode]
) -> None:
    pg = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "job"},
        "spec": {"minMember": 2},
    }
    cluster.cp.admin.post(PG.format(ns=ns), pg)
    member = gpu_pod("w0", gpus=8, labels={"scheduling.x-k8s.io/pod-group": "job"})
    cluster.create_pod(ns, member)
    # No allocator answers: the gang webhooks fail closed, so no member is created ungated.
    for replica in cluster.replicas.values():
        replica.process.stop()
    refused = None
    try:
        cluster.create_pod(ns, gpu_pod("w1", gpus=8, labels={"scheduling.x-k8s.io/pod-group": "job"}))
    except Exception as exc:  # the API server refuses the creation: its controller would retry it
        refused = exc
    assert refused is not None and "w1" not in [
        p["metadata"]["name"] for p in cluster.cp.admin.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    ]
    cluster.start_allocator("alloc-a", extra_args=("--placement",)).wait_ready()
    assert not cluster.pod(ns, "w0")["spec"].get("nodeName")  # 1 of 2: waits
    cluster.create_pod(ns, gpu_pod("w1", gpus=8, labels={"scheduling.x-k8s.io/pod-group": "job"}))
    bound = {name: cluster.wait_bound(ns, name)["spec"]["nodeName"] for name in ("w0", "w1")}
    assert sorted(bound.values()) == sorted(NODES)
    for name, node in bound.items():
        assert recorded(cluster.pod(ns, name)) == (node, list(range(8)))


def test_opted_out_and_excluded_pods_are_not_gated(
    cluster: ClusterEnv, ns: str, nodes: dict[str, PluginNode]
) -> None:
    out = gpu_pod("out", gpus=1, labels={"topoalloc.io/placement": "false"})
    created = cluster.create_pod(ns, out)
    assert not created["spec"].get("schedulingGates")
    cluster.cp.create_namespace(f"{ns}-off", labels={"topoalloc.io/placement": "false"})
    try:
        created = cluster.create_pod(f"{ns}-off", gpu_pod("off", gpus=1))
        assert not created["spec"].get("schedulingGates")
    finally:  # the `ns` fixture cleans its own namespace only
        cluster.delete_pods(f"{ns}-off")
        cluster.cp.admin.delete(f"/api/v1/namespaces/{ns}-off")


def _on_node_with_port(name: str, node: str, port: int) -> dict[str, Any]:
    """A running pod on `node` holding host port `port` (kube-scheduler's NodePorts filter refuses
    another pod asking for it there; topoalloc does not model host ports)."""
    pod = gpu_pod(name, resources={"cpu": "100m"})
    pod["spec"]["nodeName"] = node
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": port, "hostPort": port}]
    return pod


def test_a_pod_placed_where_kube_scheduler_refuses_it_still_runs(
    cluster: ClusterEnv, ns: str, nodes: dict[str, PluginNode]
) -> None:
    # pl-a half full: packing places the next pods there, where their host port is taken.
    cluster.create_pod(ns, gpu_pod("half", gpus=4, node_selector={"kubernetes.io/hostname": "pl-a"}))
    assert cluster.wait_bound(ns, "half")["spec"]["nodeName"] == "pl-a"
    cluster.create_pod(ns, _on_node_with_port("porter", "pl-a", 30123))

    # A bare pod is pinned by nomination: kube-scheduler binds it elsewhere, and the node's agent
    # chooses its devices there (its recorded allocation was made for pl-a).
    bare = gpu_pod("bare", gpus=2)
    bare["spec"]["containers"][0]["ports"] = [{"containerPort": 30123, "hostPort": 30123}]
    cluster.create_pod(ns, bare)
    pod = cluster.wait_bound(ns, "bare")
    assert pod["spec"]["nodeName"] == "pl-b" and pod["status"].get("nominatedNodeName") in ("pl-a", None)
    assert len(_admit(nodes, cluster, pod)) == 2  # served on pl-b, chosen there
    written = wait_until(
        lambda: recorded(cluster.pod(ns, "bare"))[0] == "pl-b" and cluster.pod(ns, "bare"),
        timeout=30,
        what="bare's devices written by pl-b's agent",
    )
    assert len(recorded(written)[1]) == 2

    # A Deployment's pod is pinned by node affinity (one write): refused there, it is evicted and
    # its ReplicaSet creates it anew, placed elsewhere. pl-b full first, so pl-a is where it goes.
    for name, gpus in (("fill4", 4), ("fill2", 2)):
        cluster.create_pod(ns, gpu_pod(name, gpus=gpus, node_selector={"kubernetes.io/hostname": "pl-b"}))
        assert cluster.wait_bound(ns, name)["spec"]["nodeName"] == "pl-b"
    template = gpu_pod("x", gpus=2, labels={"app": "ported"})
    template["spec"]["containers"][0]["ports"] = [{"containerPort": 30124, "hostPort": 30124}]
    cluster.create_pod(ns, _on_node_with_port("porter2", "pl-a", 30124))
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "ported"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "ported"}},
            "template": {"metadata": {"labels": {"app": "ported"}}, "spec": template["spec"]},
        },
    }
    cluster.cp.admin.post(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment)
    wait_until(
        lambda: any(e["reason"] == "Replacing" for e in cluster.events(ns)), timeout=60, what="Replacing"
    )
    cluster.cp.admin.delete(f"/api/v1/namespaces/{ns}/pods/fill2", gracePeriodSeconds=0)

    def running() -> dict[str, Any] | None:
        pods = cluster.cp.admin.get(f"/api/v1/namespaces/{ns}/pods", labelSelector="app=ported")["items"]
        return next(
            (p for p in pods if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")),
            None,
        )

    pod = wait_until(running, timeout=90, what="the Deployment's pod bound")
    assert pod["spec"]["nodeName"] == "pl-b" and recorded(pod)[0] == "pl-b"
    events = [e for e in cluster.events(ns) if e["reason"] == "Replacing"]
    assert events and "pl-a" in events[0]["message"]


def test_the_leader_killed_mid_burst_loses_nothing_and_doubles_nothing(
    cluster: ClusterEnv, ns: str, nodes: dict[str, PluginNode]
) -> None:
    standby = cluster.start_allocator("alloc-b", extra_args=("--placement",))
    standby.wait_ready("/syncz")
    for i in range(16):
        cluster.create_pod(ns, gpu_pod(f"b{i:02d}", gpus=1))
        if i == 5:
            cluster.leader().process.kill()
    bound = [cluster.wait_bound(ns, f"b{i:02d}", timeout=120) for i in range(16)]
    used = [(p["spec"]["nodeName"], m) for p in bound for m in recorded(p)[1]]
    assert len(used) == len(set(used)) == 16
    assert all(recorded(p)[0] == p["spec"]["nodeName"] for p in bound)
