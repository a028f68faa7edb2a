"""`topoalloc doctor` and `topoalloc explain pod` on a real control plane of each release (issue 41).

Its own bare control plane (as tests/cluster/test_install.py, whose world it shares:
tests/cluster/install_world.py), installed with `topoalloc install --wait`: while the installer
waits for the rollout, the stand-ins of the installed pods start (tests/support/installed.py), with
kubelet's status reports (a started process's pod Ready), two allocator replicas (a leader and a
hot standby) and agents that refresh their Device every 2 s; the installer then runs doctor and
exits 0. Doctor is green on that installation; each of these, broken by the test, is named by
doctor with its fix (exit 1), then mended and doctor green again: the allocator scaled to 0, the
webhook CA rotated without the bundle, an agent stopped (its Device stale), Koordinator's Device CRD
without the topology fields, a second device plugin DaemonSet, a kube-scheduler configuration
naming a missing extender. `explain pod` tells a placed GPU pod's story from the cluster.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.apis.paths import require_shared
from tests.cluster.install_world import CRDS, World, open_world, solo
from tests.support.cluster_product import topoalloc_argv
from tests.support.controlplane import REPO
from tests.support.installed import NAMESPACE, finish_terminating, pods
from tests.support.kube_releases import KubeRelease
from topoalloc.commands.installer import tls

STALE_AFTER = "10s"  # the agents here refresh their Device every 2 s
DEPLOYMENT = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/topoalloc-allocator"
SECRET = f"/api/v1/namespaces/{NAMESPACE}/secrets/topoalloc-allocator-tls"
DEVICE_CRD = f"{CRDS}/devices.scheduling.koordinator.sh"


@pytest.fixture(scope="module")
def world(release: KubeRelease, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Installed with `install --wait`, every installed pod's process running."""
    require_shared(release.missing_parts())
    with open_world(release, tmp_path_factory.mktemp(f"doctor-{release.minor}")) as opened:
        config = opened.workdir / "agent.yaml"
        config.write_text("statusRefreshSeconds: 2\n")
        opened.installed.kubelet = True
        opened.installed.agent_args = ("--config", str(config))
        env = {**os.environ, "KUBECONFIG": str(opened.cp.admin_kubeconfig)}
        env.pop("TOPOALLOC_DEBUG", None)
        installing = subprocess.Popen(
            topoalloc_argv("install", "--wait", "--gpu-nodes", "gpu-b", "--timeout", "4m"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=opened.workdir,
        )
        try:
            opened.wait(lambda: opened.agent_nodes() == {"gpu-a", "gpu-b"}, "agent pods on gpu-a and gpu-b")
            opened.start_installed()
            opened.installed.start_standby()
            out, err = installing.communicate(timeout=300)
        finally:
            if installing.poll() is None:
                installing.kill()
                installing.communicate()
        # what the installer said, for the first test (World.bound holds objects by name)
        opened.bound["install"] = {"code": installing.returncode, "stdout": out, "stderr": err}
        yield opened


def doctor(world: World, *args: str) -> tuple[int, dict[str, Any], str]:
    """(exit status, the JSON report, the text report) of one look."""
    ran = world.topoalloc("doctor", "--stale-after", STALE_AFTER, "-o", "json", *args, check=False)
    assert "Traceback" not in ran.stderr, ran.stderr
    text = world.topoalloc("doctor", "--stale-after", STALE_AFTER, *args, check=False).stdout
    return ran.returncode, json.loads(ran.stdout), text


def failures(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in report["checks"] if c["status"] == "fail"]


def green(world: World, *args: str) -> dict[str, Any]:
    """Doctor finds nothing wrong, not even a warning (waited for: the mended part settles first)."""
    looks: list[Any] = []

    def healthy() -> bool:
        looks.append(doctor(world, *args))
        return looks[-1][0] == 0 and looks[-1][1]["summary"]["warn"] == 0

    try:
        world.wait(healthy, "doctor green", timeout=120)
    except AssertionError:
        raise AssertionError(looks[-1][2] + world.installed.logs()) from None
    return looks[-1][1]


def test_install_wait_rolls_out_and_ends_with_doctor_green(world: World) -> None:
    ran = world.bound["install"]
    assert ran["code"] == 0, f"{ran['stdout']}\n{ran['stderr']}\n{world.installed.logs()}"
    out = ran["stdout"]
    assert "waiting for Deployment topoalloc-system/topoalloc-allocator" in out
    assert "rolled out; topoalloc doctor:" in out and out.rstrip().endswith("ok")
    assert "\nFAIL " not in out and out.splitlines()[-1].startswith("0 failed, 0 warning(s)"), out
    report = green(world)
    assert report["mode"] == "placement" and report["summary"]["warn"] == 0, report
    said = {c["what"] for c in report["checks"]}
    assert "2 of 2 allocator replicas ready" in said
    assert "placement.topoalloc.io answers kube-apiserver (a dry-run pod got topoalloc.io/placement)" in said
    assert "podgroup.gang.topoalloc.io answers kube-apiserver (a dry-run pod got topoalloc.io/gang)" in said
    assert any(w.startswith("an agent on each of the 2 GPU node(s), ready") for w in said), said
    # Read-only: the dry-run probes stored nothing.
    assert not [p for p in world.cp.admin.get("/api/v1/namespaces/default/pods")["items"]]
    world.done.add("installed")


def test_explain_pod_tells_a_placed_pods_story(world: World) -> None:
    world.need("installed")
    world.cp.admin.post("/api/v1/namespaces/default/pods", solo("gpu-pod", 2))
    pod = world.wait_bound("default", "gpu-pod")
    ran = world.topoalloc("explain", "pod", "default/gpu-pod", "-o", "json")
    story = json.loads(ran.stdout)
    alloc = story["allocation"]
    node = pod["spec"]["nodeName"]
    assert alloc["node"] == node and story["pin"]["boundTo"] == node and story["gates"] == []
    assert len(alloc["devices"]) == 2 and all(d["id"].startswith("GPU-") for d in alloc["devices"])
    # Both machines here join two GPUs by NVLink (a DGX H100's NVSwitch, the A100s' bridges).
    [link] = alloc["links"]
    assert link.split()[-1].startswith("NV"), link
    assert "Scheduled" in {e["reason"] for e in story["events"]}
    text = world.topoalloc("explain", "pod", "default/gpu-pod").stdout
    assert f"allocation: made for {node}" in text and f"links: {link}" in text
    world.cp.admin.delete("/api/v1/namespaces/default/pods/gpu-pod", gracePeriodSeconds=0)


def test_the_allocator_scaled_to_zero(world: World) -> None:
    world.need("installed")
    world.cp.admin.merge_patch(DEPLOYMENT, {"spec": {"replicas": 0}})
    world.installed.stop_allocator()  # kubelet stops the deleted pods' containers
    world.installed.stop_standby()
    world.wait(
        lambda: finish_terminating(world.cp) >= 0 and not pods(world.cp, "topoalloc-allocator"),
        "no allocator pod",
    )
    code, report, text = doctor(world)
    assert code == 1
    said = {(c["check"], c["what"].split(":")[0]): c for c in failures(report)}
    scaled = said[("allocator", "Deployment topoalloc-system/topoalloc-allocator is scaled to 0 replicas")]
    assert scaled["fix"] == "kubectl -n topoalloc-system scale deployment topoalloc-allocator --replicas=2"
    assert "FAIL  allocator  Deployment topoalloc-system/topoalloc-allocator is scaled to 0 replicas" in text
    world.cp.admin.merge_patch(DEPLOYMENT, {"spec": {"replicas": 2}})
    world.installed.start_allocator()
    world.installed.start_standby()
    green(world)


def test_the_webhook_ca_rotated_without_the_bundle(world: World) -> None:
    world.need("installed")
    before = world.cp.admin.get(SECRET)
    rotated = copy.deepcopy(before)
    files = tls.issue_secrets(NAMESPACE)["topoalloc-allocator-tls"]
    rotated["data"] = {k: base64.b64encode(v).decode() for k, v in files.items()}
    world.cp.admin.put(SECRET, rotated)
    code, report, _ = doctor(world)
    assert code == 1
    [stale] = [c for c in failures(report) if c["check"] == "webhooks"]
    assert "is not the CA in Secret topoalloc-system/topoalloc-allocator-tls" in stale["what"]
    assert "rollout restart deployment/topoalloc-allocator" in stale["fix"]
    assert "stale caBundle: placement.topoalloc.io" in stale["details"]
    back = world.cp.admin.get(SECRET)
    back["data"] = before["data"]
    world.cp.admin.put(SECRET, back)
    green(world)


def test_an_agent_stopped_leaves_its_device_stale(world: World) -> None:
    world.need("installed")
    world.installed.stop_agent("gpu-b")
    try:
        looks: list[Any] = []

        def stale() -> bool:
            looks.append(doctor(world))
            return any(c["what"].startswith("Device gpu-b is stale") for c in failures(looks[-1][1]))

        world.wait(stale, "doctor naming gpu-b's Device stale", timeout=60)
        code, report, text = looks[-1]
        assert code == 1
        whats = [c["what"] for c in failures(report)]
        assert "node gpu-b: the agent is not ready" in whats, text
        assert not any("gpu-a" in w for w in whats), text
        assert "spec.nodeName=gpu-b" in text
    finally:
        world.installed.start_agents()
    green(world)


def test_koordinators_device_crd_without_the_topology_fields(world: World) -> None:
    world.need("installed")
    crd = world.cp.admin.get(DEVICE_CRD)
    original = copy.deepcopy(crd["spec"])
    item = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "devices"
    ]["items"]
    del item["properties"]["nvlink"]
    for extra in ("pcieSwitchID", "pciePath"):
        del item["properties"]["topology"]["properties"][extra]
    world.cp.admin.put(DEVICE_CRD, crd)
    code, report, _ = doctor(world)
    assert code == 1
    [pruned] = [c for c in failures(report) if c["check"] == "crds"]
    assert (
        "CRD devices.scheduling.koordinator.sh's schema lacks 3 field(s) topoalloc writes" in pruned["what"]
    )
    assert "pruned: spec.devices[].nvlink" in pruned["details"]
    assert pruned["fix"].startswith("topoalloc install")
    back = world.cp.admin.get(DEVICE_CRD)
    back["spec"] = original
    world.cp.admin.put(DEVICE_CRD, back)
    green(world)


def test_a_second_device_plugin_daemonset(world: World) -> None:
    world.need("installed")
    world.start_nvidia_device_plugin()
    code, report, _ = doctor(world)
    assert code == 1
    [second] = [c for c in failures(report) if c["check"] == "plugins"]
    assert second["what"].startswith(
        "DaemonSet gpu-operator/nvidia-device-plugin-daemonset runs a second device plugin on the agent's node(s) gpu-a:"
    )
    assert "nvidia.com/gpu.deploy.device-plugin=false" in second["fix"]
    world.cp.admin.delete("/api/v1/namespaces/gpu-operator")
    world.wait(
        lambda: (
            finish_terminating(world.cp, "gpu-operator") >= 0
            and world.gone("/api/v1/namespaces/gpu-operator")
        ),
        "namespace gpu-operator gone",
    )
    green(world)


def test_a_kube_scheduler_configuration_naming_a_missing_extender(world: World) -> None:
    world.need("installed")
    text = (REPO / "deploy" / "kube-scheduler" / "kube-scheduler-config.yaml").read_text()
    missing = world.workdir / "missing-extender.yaml"
    missing.write_text(text.replace("ALLOCATOR_CLUSTER_IP", "10.0.0.250"))
    code, report, _ = doctor(world, "--scheduler-config", str(missing))
    assert code == 1
    [named] = failures(report)
    assert named["check"] == "scheduler" and named["what"] == (
        f"kube-scheduler's extender https://10.0.0.250:8443 (file {missing}) is missing: no Service of this cluster "
        "has the ClusterIP 10.0.0.250; every pod asking for a device it manages fails to schedule"
    )
    assert named["fix"].startswith("topoalloc install --mode kubeadm writes it anew")
    # The same configuration naming the allocator Service's ClusterIP: the extender is there.
    ip = world.cp.admin.get(f"/api/v1/namespaces/{NAMESPACE}/services/topoalloc-allocator")["spec"][
        "clusterIP"
    ]
    right = world.workdir / "extender.yaml"
    right.write_text(text.replace("ALLOCATOR_CLUSTER_IP", ip))
    report = green(world, "--scheduler-config", str(right))
    [wired] = [c for c in report["checks"] if c["check"] == "scheduler" and "extender" in c["what"]]
    assert wired["what"].startswith(
        f"kube-scheduler's extender https://{ip}:8443 (file {right}) is the allocator's Service"
    )
    assert yaml.safe_load(right.read_text())["extenders"][0]["urlPrefix"] == f"https://{ip}:8443"
