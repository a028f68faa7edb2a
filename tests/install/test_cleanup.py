"""`topoalloc cleanup` and the cleanup `uninstall` ends with, on the fake API server: each kind of
trace goes (the agent's Node labels and status resources, ResourceSlices of topoalloc's driver,
topoalloc's DeviceClasses, its scheduling gates) and nothing of anyone else's; the webhooks go
before the agents, and the Nodes are cleaned only once the agent pods are gone; what stays on
purpose is said; the exit status says whether everything went."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from apis import dra, keys
from tests.install.removal_world import AGENT_RESOURCES, NAMESPACE, traces
from tests.support.fakeapi import FakeApiServer
from tests.support.kubeconfig import token_kubeconfig
from topoalloc.cli import main
from topoalloc.commands.installer.cleanup import cleanup
from topoalloc.commands.installer.cluster import Cluster, connect


@pytest.fixture
def world(fake_api_thread: FakeApiServer) -> FakeApiServer:
    traces(fake_api_thread)
    return fake_api_thread


@pytest.fixture
def cluster(world: FakeApiServer, tmp_path: Path) -> Iterator[Cluster]:
    opened = connect(str(token_kubeconfig(tmp_path, world.url)), None, False)
    try:
        yield opened
    finally:
        opened.close()


def _names(fake: FakeApiServer, resource: str, namespace: str | None = None) -> set[str]:
    return {o["metadata"]["name"] for o in fake.list_objects(resource, namespace)}


def _gates(fake: FakeApiServer, name: str) -> list[str]:
    found = fake.get("pods", name, "train")
    assert found is not None
    return [g["name"] for g in found["spec"].get("schedulingGates") or []]


def _kubelet_ends_the_agent(fake: FakeApiServer) -> Any:
    """The wait's sleep: what kubelet does meanwhile, the deleted DaemonSet's pod ends."""
    return lambda _seconds: fake.remove("pods", "topoalloc-agent-x1", NAMESPACE)


def test_every_trace_goes_and_nothing_of_anyone_elses(world: FakeApiServer, cluster: Cluster) -> None:
    world.clear_requests()
    done = cleanup(cluster, sleep=_kubelet_ends_the_agent(world), timeout=30)
    assert done.problems == 0, done.report

    # The agent's node: its labels and status resources gone, kubelet's and the user's kept.
    node = world.get("nodes", "gpu-a")
    assert node is not None
    labels = node["metadata"]["labels"]
    assert labels == {"kubernetes.io/hostname": "gpu-a", "team": "ml"}
    for field in ("capacity", "allocatable"):
        assert set(node["status"][field]) == {"cpu", "memory", "pods", "nvidia.com/gpu"}, field
    # Another system's node (no topoalloc.io/device-mode): untouched.
    other = world.get("nodes", "cpu-1")
    assert other is not None
    assert other["metadata"]["labels"][keys.GPU_MODEL] == "T4"
    assert other["status"]["capacity"]["koordinator.sh/gpu"] == "100"

    assert _names(world, "resourceslices") == {"gpu-a-gpu.nvidia.com-0"}
    assert _names(world, "deviceclasses") == {"gpu.nvidia.com"}
    assert _names(world, "mutatingwebhookconfigurations") == {"someone-elses"}
    assert _names(world, "daemonsets", NAMESPACE) == set()

    # Gates: topoalloc's released, another controller's kept.
    assert _gates(world, "placed") == []
    assert _gates(world, "member") == ["example.com/quota"]
    assert _gates(world, "quota-only") == ["example.com/quota"]

    text = "\n".join(done.report.lines)
    assert (
        "removed from node gpu-a: labels topoalloc.io/device-mode, node.koordinator.sh/gpu-vendor, "
        "node.koordinator.sh/gpu-model, topoalloc.io/topology-manager-scope; status resources "
        "koordinator.sh/gpu, koordinator.sh/gpu-core, koordinator.sh/gpu-memory, "
        "koordinator.sh/gpu-memory-ratio, koordinator.sh/rdma"
    ) in text, text
    assert (
        f"released scheduling gate(s) {keys.GANG_SCHEDULING_GATE}, {dra.SCHEDULING_GATE} of pod train/member"
        in text
    )
    # What stays on purpose, said: the allocated claim, the held Reservation, the running pod.
    assert done.leftovers.claims == ("train/pair",)
    assert done.leftovers.reservations == ("held",)
    assert done.leftovers.pods == ("train/trainer",)
    assert "left 1 ResourceClaim(s) allocated from topoalloc.io's devices" in text
    assert "left 1 Reservation(s) holding room" in text and ": held" in text

    # The order: the webhooks, then the agents, and the Nodes only once the agent pod was gone.
    writes = [(r.method, r.path) for r in world.requests() if r.method != "GET"]
    webhook = writes.index(
        ("DELETE", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/topoalloc-gang")
    )
    daemonset = writes.index(("DELETE", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/topoalloc-agent"))
    status = writes.index(("PATCH", "/api/v1/nodes/gpu-a/status"))
    assert webhook < daemonset < status


def test_a_second_run_finds_nothing_left(world: FakeApiServer, cluster: Cluster) -> None:
    cleanup(cluster, sleep=_kubelet_ends_the_agent(world), timeout=30)
    world.clear_requests()
    again = cleanup(cluster, timeout=30)
    assert again.problems == 0
    assert {r.method for r in world.requests()} == {"GET"}
    assert not [line for line in again.report.lines if not line.startswith("left ")]


def test_dry_run_says_what_would_go_and_changes_nothing(world: FakeApiServer, cluster: Cluster) -> None:
    world.clear_requests()
    done = cleanup(cluster, dry_run=True, timeout=30)
    assert {r.method for r in world.requests()} == {"GET"}
    text = "\n".join(done.report.lines)
    for line in (
        "would delete MutatingWebhookConfiguration topoalloc-gang",
        f"would delete DaemonSet {NAMESPACE}/topoalloc-agent",
        "would remove from node gpu-a: labels topoalloc.io/device-mode",
        "would delete ResourceSlice gpu-a-topoalloc.io-0",
        "would delete DeviceClass gpu.topoalloc.io",
        f"would release scheduling gate(s) {keys.PLACEMENT_GATE} of pod train/placed",
    ):
        assert line in text, text
    assert _gates(world, "placed") == [keys.PLACEMENT_GATE]


def test_a_gate_list_changed_meanwhile_is_read_again(world: FakeApiServer, cluster: Cluster) -> None:
    # Another controller removes its gate between cleanup's read and its patch: the index-tested
    # patch fails, cleanup reads the pod again and removes topoalloc's gates, not another one.
    fault = world.inject_fault("PATCH", r"/api/v1/namespaces/train/pods/member$", status=422, times=1)
    pod = world.get("pods", "member", "train")
    assert pod is not None
    pod["spec"]["schedulingGates"] = [{"name": keys.GANG_SCHEDULING_GATE}, {"name": dra.SCHEDULING_GATE}]
    world.put(pod)
    cleanup(cluster, sleep=_kubelet_ends_the_agent(world), timeout=30)
    assert fault.hits == 1 and _gates(world, "member") == []


def test_agent_pods_that_do_not_go_leave_their_nodes_and_fail(world: FakeApiServer, tmp_path: Path) -> None:
    config = token_kubeconfig(tmp_path, world.url)
    ran = CliRunner().invoke(main, ["cleanup", "--kubeconfig", str(config), "--timeout", "0"])
    assert ran.exit_code == 1, ran.output
    assert "warning: 1 agent pod(s) still there after 0 s (on gpu-a)" in ran.stderr
    node = world.get("nodes", "gpu-a")
    assert node is not None and dra.MODE_LABEL in node["metadata"]["labels"]
    assert set(AGENT_RESOURCES) <= set(node["status"]["capacity"])
    assert "gpu-a-topoalloc.io-0" in _names(world, "resourceslices")
    # Everything not tied to that node went all the same.
    assert _names(world, "deviceclasses") == {"gpu.nvidia.com"}
    assert _gates(world, "placed") == []
    assert "deleted DeviceClass rdma-vf.topoalloc.io" in ran.stdout

    world.remove("pods", "topoalloc-agent-x1", NAMESPACE)  # kubelet got there in the end
    ran = CliRunner().invoke(main, ["cleanup", "--kubeconfig", str(config), "--timeout", "0"])
    assert ran.exit_code == 0, ran.output
    assert (
        "removed from node gpu-a" in ran.stdout and "deleted ResourceSlice gpu-a-topoalloc.io-0" in ran.stdout
    )


def test_a_refused_removal_is_exit_1_and_the_rest_still_goes(world: FakeApiServer, tmp_path: Path) -> None:
    world.inject_fault("DELETE", r"/deviceclasses/gpu\.topoalloc\.io$", status=403, message="forbidden")
    world.remove("pods", "topoalloc-agent-x1", NAMESPACE)
    config = token_kubeconfig(tmp_path, world.url)
    ran = CliRunner().invoke(main, ["cleanup", "--kubeconfig", str(config)])
    assert ran.exit_code == 1, ran.output
    assert "warning: DeviceClass gpu.topoalloc.io: not deleted: HTTP 403" in ran.stderr
    assert _names(world, "deviceclasses") == {"gpu.nvidia.com", "gpu.topoalloc.io"}
    assert "removed from node gpu-a" in ran.stdout


def test_uninstall_after_a_kubeadm_install_says_what_to_undo_on_the_control_plane(
    world: FakeApiServer, tmp_path: Path
) -> None:
    record = {"version": "0.1.0", "mode": "kubeadm"}
    managed = {"app.kubernetes.io/managed-by": "topoalloc", "app.kubernetes.io/part-of": "topoalloc"}
    world.put(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "topoalloc-install", "namespace": NAMESPACE, "labels": managed},
            "data": record,
        }
    )
    world.put(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "topoalloc-allocator", "namespace": NAMESPACE, "labels": managed},
            "spec": {"clusterIP": "10.96.0.50", "ports": [{"port": 8443}]},
        }
    )
    # kubeadm's kube-scheduler as its mirror pod shows it, started with the copied configuration.
    world.put(
        pod_in_kube_system(
            "kube-scheduler-cp-1",
            ["kube-scheduler", "--config=/etc/kubernetes/topoalloc/kube-scheduler-config.yaml"],
        )
    )
    world.remove("pods", "topoalloc-agent-x1", NAMESPACE)
    config = token_kubeconfig(tmp_path, world.url)
    ran = CliRunner().invoke(main, ["uninstall", "--kubeconfig", str(config)])
    assert ran.exit_code == 0, ran.output
    assert world.get("services", "topoalloc-allocator", NAMESPACE) is None
    assert "removed from node gpu-a" in ran.stdout
    warnings = ran.stderr
    for line in (
        "warning: kube-scheduler on the control plane still calls the allocator (install --mode kubeadm; "
        "running with its configuration: kube-scheduler-cp-1)",
        "remove --config=/etc/kubernetes/topoalloc/kube-scheduler-config.yaml from the command and the "
        "volume and volumeMount named topoalloc",
        "kubelet restarts kube-scheduler when the file changes",
        "the extender block to remove (/etc/kubernetes/topoalloc/kube-scheduler-config.yaml, under extenders:)",
        "warning:     - urlPrefix: https://10.96.0.50:8443",
        "warning:       ignorable: false",
        "rm -r /etc/kubernetes/topoalloc",
    ):
        assert line in warnings, warnings


def test_uninstall_of_a_placement_install_says_nothing_of_kubeadm(
    world: FakeApiServer, tmp_path: Path
) -> None:
    world.put(
        pod_in_kube_system("kube-scheduler-cp-1", ["kube-scheduler", "--config=/etc/kubernetes/s.yaml"])
    )
    world.remove("pods", "topoalloc-agent-x1", NAMESPACE)
    ran = CliRunner().invoke(main, ["uninstall", "--kubeconfig", str(token_kubeconfig(tmp_path, world.url))])
    assert ran.exit_code == 0, ran.output
    assert "kube-scheduler" not in ran.stderr and "released scheduling gate(s)" in ran.stdout
    # A webhook configuration and DaemonSet without the installer's label (a Helm release's) stay:
    # uninstall deletes what the installer made; `topoalloc cleanup` is the chart's.
    assert _names(world, "mutatingwebhookconfigurations") == {"topoalloc-gang", "someone-elses"}
    assert _names(world, "daemonsets", NAMESPACE) == {"topoalloc-agent"}


def pod_in_kube_system(name: str, command: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "kube-system", "labels": {"component": "kube-scheduler"}},
        "spec": {
            "nodeName": "cp-1",
            "containers": [{"name": "kube-scheduler", "image": "k", "command": command}],
        },
        "status": {"phase": "Running"},
    }


def test_a_node_changed_meanwhile_is_read_again(world: FakeApiServer, cluster: Cluster) -> None:
    # kubelet writes the node's status between cleanup's read and its patch: the tested patch fails,
    # cleanup reads the node again and removes what is there then.
    fault = world.inject_fault("PATCH", r"/api/v1/nodes/gpu-a/status$", status=422, times=1)
    node = world.get("nodes", "gpu-a")
    assert node is not None
    for part in ("capacity", "allocatable"):
        node["status"][part]["koordinator.sh/gpu-core"] = "700"
    world.put(node)
    done = cleanup(cluster, sleep=_kubelet_ends_the_agent(world), timeout=30)
    assert fault.hits == 1 and done.problems == 0
    after = world.get("nodes", "gpu-a")
    assert after is not None and "koordinator.sh/gpu-core" not in after["status"]["capacity"]
