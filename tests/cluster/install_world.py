"""The world tests/cluster/test_install.py's steps share: a bare control plane of one release with
three nodes, the installer run against it, the stand-ins of the installed pods
(tests/support/installed.py), and what the steps ask of them. No tests here."""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.install.removal_world import resource_slice
from tests.support.cluster_product import topoalloc_argv
from tests.support.controlplane import REPO, ApiStatus, ControlPlane, ControlPlaneError, wait_until
from tests.support.installed import NAMESPACE, ClusterNetwork, Installed, finish_terminating, pods
from tests.support.kube_releases import KubeRelease

NODES = {"gpu-a": "dgx-h100", "gpu-b": "a100-pcie-4x-nvlink-pairs", "cpu-1": "cpu-only"}
GPUS = {"gpu-a": 8, "gpu-b": 4, "cpu-1": 0}
MANAGED = "app.kubernetes.io/managed-by=topoalloc"
PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"
DEVICES = "/apis/scheduling.koordinator.sh/v1alpha1/devices"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
ALLOCATED_NODE = "topoalloc.io/allocated-node"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
DEVICE_CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
MODE_LABEL = "topoalloc.io/device-mode"
# What the agent publishes in Node status (device-plugin mode), and a label of its (Koordinator's key).
AGENT_RESOURCES = {
    "koordinator.sh/gpu": "800",
    "koordinator.sh/gpu-core": "800",
    "koordinator.sh/gpu-memory": "640Gi",
    "koordinator.sh/gpu-memory-ratio": "800",
    "koordinator.sh/rdma": "100",
}
OTHER_GATE = "example.com/quota"


@dataclass
class World:
    cp: ControlPlane
    workdir: Path
    installed: Installed
    done: set[str] = field(default_factory=set)  # the steps that passed
    bound: dict[str, dict[str, Any]] = field(default_factory=dict)  # ns/name -> pod when bound

    def topoalloc(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.cp.admin_kubeconfig)}
        env.pop("TOPOALLOC_DEBUG", None)
        ran = subprocess.run(
            topoalloc_argv(*args), capture_output=True, text=True, timeout=300, env=env, cwd=self.workdir
        )
        if check:
            assert ran.returncode == 0, (
                f"topoalloc {' '.join(args)}: {ran.returncode}\n{ran.stdout}\n{ran.stderr}"
            )
        return ran

    def need(self, *steps: str) -> None:
        missing = [s for s in steps if s not in self.done]
        if missing:
            pytest.skip(f"an earlier step failed: {', '.join(missing)}")

    def wait(self, check: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
        try:
            return wait_until(check, timeout=timeout, what=what)
        except ControlPlaneError as exc:
            raise AssertionError(f"{exc}\n{self.installed.logs()}\n{self.cp.logs(20)}") from None

    def pod(self, ns: str, name: str) -> dict[str, Any]:
        return self.cp.admin.get(f"/api/v1/namespaces/{ns}/pods/{name}")

    def wait_bound(self, ns: str, name: str) -> dict[str, Any]:
        pod = self.wait(lambda: (p := self.pod(ns, name))["spec"].get("nodeName") and p, f"{ns}/{name} bound")
        self.bound[f"{ns}/{name}"] = pod
        return pod

    def agent_nodes(self) -> set[str]:
        return {p["spec"].get("nodeName") for p in pods(self.cp, "topoalloc-agent")}

    def ours(self) -> list[str]:
        """Every object carrying the installer's label (the kinds it makes)."""
        out = []
        for kind in ("crd", "ns", "all", "cm", "secret", "sa", "role", "rolebinding", "clusterrole",
                     "clusterrolebinding", "validatingadmissionpolicy", "validatingadmissionpolicybinding",
                     "mutatingwebhookconfiguration", "pdb"):  # fmt: skip
            got = self.cp.kubectl("get", kind, "-A", "-l", MANAGED, "-o", "name").stdout.split()
            out += got
        return sorted(set(out))

    def readme_step(self, command: str) -> subprocess.CompletedProcess[str] | None:
        """One of README's Deploy commands, run as written against this cluster."""
        words = shlex.split(command)
        if words[0] == "make":
            return None  # `make image`: no container runtime runs the image here (no kubelet)
        if words[0] == ".venv/bin/topoalloc":
            return self.topoalloc(*words[1:])
        assert words[0] == "kubectl", command
        args = [str(REPO / w) if w.startswith("examples/") else w for w in words[1:]]
        return self.cp.kubectl(*args)

    def bound_by(self, ns: str, name: str) -> str:
        """The scheduler whose Scheduled Event says it bound the pod."""

        def scheduled() -> str | None:
            events = self.cp.admin.get(
                f"/api/v1/namespaces/{ns}/events",
                fieldSelector=f"involvedObject.name={name},reason=Scheduled",
            )["items"]
            return next((e.get("reportingComponent") or e["source"]["component"] for e in events), None)

        return str(self.wait(scheduled, f"the Scheduled Event of {ns}/{name}"))

    def start_installed(self) -> None:
        """The installed pods' processes, once their pods are there (what kubelet would start)."""
        self.wait(lambda: self.agent_nodes() and None not in self.agent_nodes(), "agent pods bound")
        self.wait(lambda: pods(self.cp, "topoalloc-allocator"), "allocator pods")
        self.installed.start_agents()
        for node in self.installed.agents:
            self.wait(
                lambda n=node: self.cp.admin.get(f"{DEVICES}/{n}").get("status") or None, f"Device {node}"
            )
        self.installed.start_allocator()

    def start_nvidia_device_plugin(self) -> None:
        """NVIDIA's device plugin DaemonSet as the GPU operator installs it (a second plugin for
        nvidia.com/gpu beside the agent), its pod scheduled on gpu-a."""
        self.cp.create_namespace("gpu-operator")
        plugin = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "gpu-operator"},
            "spec": {
                "selector": {"matchLabels": {"app": "nvidia-device-plugin"}},
                "template": {
                    "metadata": {"labels": {"app": "nvidia-device-plugin"}},
                    "spec": {
                        "nodeSelector": {"nvidia.com/gpu.present": "true"},
                        "containers": [
                            {"name": "plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}
                        ],
                    },
                },
            },
        }
        self.cp.admin.post("/apis/apps/v1/namespaces/gpu-operator/daemonsets", plugin)
        self.wait(
            lambda: any(
                p["spec"].get("nodeName") == "gpu-a"
                for p in self.cp.admin.get("/api/v1/namespaces/gpu-operator/pods")["items"]
            ),
            "the device plugin's pod on gpu-a",
        )

    def webhook_policies(self) -> dict[str, str]:
        return {
            h["name"]: h["failurePolicy"] for h in self.cp.admin.get(f"{WEBHOOKS}/topoalloc-gang")["webhooks"]
        }

    def gone(self, path: str) -> bool:
        try:
            self.cp.admin.get(path)
        except ApiStatus as exc:
            return exc.status == 404
        return False

    def established(self, name: str) -> bool:
        conditions = (self.cp.admin.get(f"{CRDS}/{name}").get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


@contextmanager
def open_world(release: KubeRelease, workdir: Path) -> Iterator[World]:
    """The control plane started, its nodes made; everything stopped after."""
    network = ClusterNetwork(workdir / "network")  # kube-apiserver reaches the webhooks' Services through it
    cp = ControlPlane(
        workdir / "k8s", controller_manager=True, release=release, apiserver_args=(network.egress_flag(),)
    )
    installed = Installed(cp, workdir, dict(NODES), network=network)
    try:
        cp.start()
        for name in NODES:
            labels = {"nvidia.com/gpu.present": "true"} if name == "gpu-a" else {}
            cp.create_node(
                name, capacity={"nvidia.com/gpu": str(GPUS[name])} if GPUS[name] else {}, labels=labels
            )
        yield World(cp, workdir, installed)
    finally:
        installed.stop()
        cp.stop()
        network.close()


def member(name: str, gpus: int) -> dict[str, Any]:
    """A member of the scheduler-plugins gang train/trainers, of the default scheduler."""
    return {
        "metadata": {"name": name, "labels": {"scheduling.x-k8s.io/pod-group": "trainers"}},
        "spec": {
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
    }


def solo(name: str, gpus: int, scheduler: str = "default-scheduler") -> dict[str, Any]:
    """A pod asking for `gpus` whole GPUs, for `scheduler`."""
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
    }


def leave_traces(world: World, *, device_classes: bool = True) -> None:
    """What the agent and the webhooks leave outside the installed objects, made as they make them:
    the agent's Node label and status resources (the status subresource), its ResourceSlices (a dra
    pool on gpu-b), the DeviceClasses of deploy/dra (unless `device_classes` is false: installed
    already), and a pod topoalloc gated; beside others' (a slice and a class of another driver,
    another system's resource on cpu-1, another gate)."""
    admin = world.cp.admin
    for node, mode in (("gpu-a", "device-plugin"), ("gpu-b", "dra")):
        admin.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {MODE_LABEL: mode}}})
        status = {"capacity": AGENT_RESOURCES, "allocatable": AGENT_RESOURCES}
        admin.request(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            {"status": status},
            content_type="application/merge-patch+json",
        )
    others = {"capacity": {"koordinator.sh/gpu": "100"}, "allocatable": {"koordinator.sh/gpu": "100"}}
    admin.request(
        "PATCH", "/api/v1/nodes/cpu-1/status", {"status": others}, content_type="application/merge-patch+json"
    )
    admin.post(SLICES, resource_slice("gpu-b-topoalloc.io-abcde", "gpu-b", "topoalloc.io"))
    admin.post(SLICES, resource_slice("gpu-b-gpu.example.com-abcde", "gpu-b", "gpu.example.com"))
    if device_classes:
        world.cp.kubectl("apply", "-k", str(REPO / "deploy" / "dra"))
    admin.post(
        DEVICE_CLASSES,
        {
            "metadata": {"name": "gpu.example.com"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]},
        },
    )
    gated = {
        "metadata": {"name": "gated"},
        "spec": {
            "schedulingGates": [{"name": OTHER_GATE}, {"name": "topoalloc.io/placement"}],
            "containers": [{"name": "c", "image": "x"}],
        },
    }
    admin.post("/api/v1/namespaces/train/pods", gated)


def traces_gone(world: World, ran: subprocess.CompletedProcess[str]) -> None:
    """Every trace leave_traces made (and the agents wrote) is gone, and nothing of anyone else's."""
    admin = world.cp.admin
    for node in ("gpu-a", "gpu-b"):
        found = admin.get(f"/api/v1/nodes/{node}")
        labels = found["metadata"]["labels"]
        assert MODE_LABEL not in labels and "node.koordinator.sh/gpu-model" not in labels, labels
        for part in ("capacity", "allocatable"):
            left = [k for k in found["status"][part] if k.startswith("koordinator.sh/")]
            assert left == [], (node, part, left)
        assert "nvidia.com/gpu" in found["status"]["capacity"] or node != "gpu-a"  # kubelet's, kept
    other = admin.get("/api/v1/nodes/cpu-1")
    assert other["status"]["capacity"]["koordinator.sh/gpu"] == "100"
    assert [s["metadata"]["name"] for s in admin.get(SLICES)["items"]] == ["gpu-b-gpu.example.com-abcde"]
    assert [c["metadata"]["name"] for c in admin.get(DEVICE_CLASSES)["items"]] == ["gpu.example.com"]
    pod = admin.get("/api/v1/namespaces/train/pods/gated")
    assert pod["spec"]["schedulingGates"] == [{"name": OTHER_GATE}]
    for line in (
        "released scheduling gate(s) topoalloc.io/placement of pod train/gated",
        "deleted ResourceSlice gpu-b-topoalloc.io-abcde",
        "deleted DeviceClass gpu.topoalloc.io",
        "removed from node gpu-b: labels topoalloc.io/device-mode",
    ):
        assert line in ran.stdout, ran.stdout


@contextmanager
def kubelet_ending_deleted_pods(world: World) -> Iterator[None]:
    """While the block runs: what kubelet does for a deleted pod once its containers stopped."""
    done = threading.Event()

    def loop() -> None:
        while not done.wait(0.5):
            finish_terminating(world.cp)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
