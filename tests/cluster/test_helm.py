"""The Helm chart on a bare control plane of each release: install, upgrade, rollback, uninstall.

One control plane for the module (tests/cluster/install_world.py: no kubelet, three nodes: gpu-a
labelled by GPU Feature Discovery, gpu-b, cpu-1); gpu-b is put in an agent pool by its label. The
steps build on each other: `helm install` as README says it (the release in `default`; secondary
mode, a DRA pool), `helm upgrade` changing
that pool's settings, `helm rollback`, `helm uninstall` with user objects in the CRDs and the
traces the agent and the webhooks leave, which the chart's pre-delete hook removes: its Job's pod
is run here as kubelet would run it (hook_kubelet).
"""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from tests.apis.paths import require_shared
from tests.cluster.harness import gpu_minors
from tests.cluster.install_world import (
    CRDS,
    DEPLOYMENTS,
    WEBHOOKS,
    World,
    kubelet_ending_deleted_pods,
    leave_traces,
    open_world,
    solo,
    traces_gone,
)
from tests.support.cluster_product import service_account_token, topoalloc_argv
from tests.support.controlplane import REPO, ApiStatus
from tests.support.helm import require_helm
from tests.support.installed import NAMESPACE, finish_terminating
from tests.support.kube_releases import KubeRelease

CHART = REPO / "charts" / "topoalloc"
DAEMONSETS = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets"
SECRETS = f"/api/v1/namespaces/{NAMESPACE}/secrets"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
HOOK_JOB = "topoalloc-cleanup"
POOL = {"topoalloc.io/agent-pool": "dra"}
VALUES = {
    "mode": "secondary",
    "agent": {"pools": {"dra": {"nodeSelector": POOL, "config": {"mode": "dra"}}}},
}
OUR_CRDS = (
    "devices.scheduling.koordinator.sh",
    "podgroups.scheduling.x-k8s.io",
    "reservations.scheduling.koordinator.sh",
)


@pytest.fixture(scope="module")
def world(release: KubeRelease, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    require_shared(release.missing_parts())
    require_helm()
    with open_world(release, tmp_path_factory.mktemp(f"helm-{release.minor}")) as opened:
        # gpu-b: a GPU node by hand (no GPU label) in the DRA pool
        labels = {"topoalloc.io/gpu-node": "true", **POOL}
        opened.cp.admin.merge_patch("/api/v1/nodes/gpu-b", {"metadata": {"labels": labels}})
        yield opened


def helm(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    binary = require_helm()
    config = world.workdir / "helm"
    env = {
        "KUBECONFIG": str(world.cp.admin_kubeconfig),
        "HELM_CACHE_HOME": str(config / "cache"),
        "HELM_CONFIG_HOME": str(config / "config"),
        "HELM_DATA_HOME": str(config / "data"),
        "HOME": str(config),  # helm's kube discovery cache, kept out of the checkout
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, f"helm {' '.join(args)}: {done.stdout}\n{done.stderr}"
    return done


def values_file(world: World, name: str, values: dict[str, Any]) -> Path:
    path = world.workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def template_hash(world: World, name: str) -> tuple[int, str]:
    ds = world.cp.admin.get(f"{DAEMONSETS}/{name}")
    return ds["metadata"]["generation"], ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


def secrets(world: World) -> dict[str, dict[str, str]]:
    return {
        n: world.cp.admin.get(f"{SECRETS}/{n}")["data"]
        for n in ("topoalloc-allocator-tls", "topoalloc-scheduler-client")
    }


def test_helm_install(world: World) -> None:
    # As README says it: the release in `default`, the chart making topoalloc-system.
    helm(world, "install", "topoalloc", str(CHART), "-f", str(values_file(world, "values", VALUES)))
    for name in OUR_CRDS:
        world.wait(lambda n=name: world.established(n), f"CRD {name} established")
    # One DaemonSet per pool, each on its nodes: the default one on gpu-a, the pool's on gpu-b.
    for name, node in (("topoalloc-agent", "gpu-a"), ("topoalloc-agent-dra", "gpu-b")):
        world.wait(
            lambda n=name: (
                world.cp.admin.get(f"{DAEMONSETS}/{n}").get("status", {}).get("desiredNumberScheduled") == 1
            ),
            f"{name} desired on one node",
        )
        ds = world.cp.admin.get(f"{DAEMONSETS}/{name}")
        config = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
        assert config["configMap"]["name"] == name
        selector = ",".join(f"{k}={v}" for k, v in ds["spec"]["selector"]["matchLabels"].items())

        def placed(selector: str = selector, name: str = name) -> set[str]:
            got = world.cp.admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=selector)["items"]
            return {
                p["spec"].get("nodeName") for p in got if p["metadata"]["ownerReferences"][0]["name"] == name
            }

        world.wait(lambda p=placed, n=node: p() == {n}, f"{name}'s pod on {node}")
    cm = world.cp.admin.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/topoalloc-agent-dra")
    assert yaml.safe_load(cm["data"]["agent.yaml"])["mode"] == "dra"
    # The certificates: made once, one CA, the webhook trusting it, names the API server checks.
    files = secrets(world)
    ca = base64.b64decode(files["topoalloc-allocator-tls"]["ca.crt"])
    assert base64.b64decode(files["topoalloc-scheduler-client"]["ca.crt"]) == ca
    server = x509.load_pem_x509_certificate(base64.b64decode(files["topoalloc-allocator-tls"]["tls.crt"]))
    server.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert {f"topoalloc-allocator.{NAMESPACE}.svc", f"topoalloc-webhook.{NAMESPACE}.svc"} <= set(names)
    hooks = world.cp.admin.get(f"{WEBHOOKS}/topoalloc-gang")["webhooks"]
    assert {base64.b64decode(h["clientConfig"]["caBundle"]) for h in hooks} == {ca}
    assert world.webhook_policies()["podgroup.gang.topoalloc.io"] == "Ignore"  # secondary: an extender holds
    # The second kube-scheduler pinned to the server's version.
    server_version = world.cp.admin.get("/version")["gitVersion"].split("-")[0]
    scheduler = world.cp.admin.get(f"{DEPLOYMENTS}/topoalloc-scheduler")
    assert [c["image"] for c in scheduler["spec"]["template"]["spec"]["containers"]] == [
        f"registry.k8s.io/kube-scheduler:{server_version}"
    ]
    classes = world.cp.admin.get("/apis/resource.k8s.io/v1/deviceclasses")["items"]
    assert {c["metadata"]["name"] for c in classes} >= {"gpu.topoalloc.io"}
    world.done.add("install")


def test_what_helm_installed_places_a_gpu_pod(world: World) -> None:
    """The same cluster then runs what the chart installed, as the end-to-end test of the installer
    does: the installed pods' processes start with the chart's credentials (what kubelet would
    start), and a pod of the chart's second kube-scheduler is placed by the allocator (two GPUs
    recorded) and bound by that scheduler. The processes stop afterwards,
    so that the uninstall step finds only the traces it plants."""
    world.need("install")
    world.start_installed()
    world.installed.start_scheduler()
    try:
        world.cp.admin.post(
            "/api/v1/namespaces/default/pods", solo("helm-pod", 2, scheduler="topoalloc-scheduler")
        )
        pod = world.wait_bound("default", "helm-pod")
        assert len(gpu_minors(pod)) == 2  # its devices recorded by the extender's bind
        assert world.bound_by("default", "helm-pod") == "topoalloc-scheduler"
        world.cp.admin.delete("/api/v1/namespaces/default/pods/helm-pod", gracePeriodSeconds=0)
    finally:
        world.installed.stop_scheduler()
        world.installed.stop_allocator()
        world.installed.stop_agents()
    world.done.add("placed")


def test_helm_upgrade_rolls_only_the_pool_changed_and_keeps_the_certificates(world: World) -> None:
    world.need("install")
    before = {n: template_hash(world, n) for n in ("topoalloc-agent", "topoalloc-agent-dra")}
    allocator = world.cp.admin.get(f"{DEPLOYMENTS}/topoalloc-allocator")["metadata"]["generation"]
    files = secrets(world)
    helm(world, "upgrade", "topoalloc", str(CHART),
         "-f", str(values_file(world, "values", VALUES)), "--set", "agent.pools.dra.config.resyncSeconds=5")  # fmt: skip
    after = {n: template_hash(world, n) for n in before}
    assert after["topoalloc-agent"] == before["topoalloc-agent"]
    assert after["topoalloc-agent-dra"][0] > before["topoalloc-agent-dra"][0]
    assert after["topoalloc-agent-dra"][1] != before["topoalloc-agent-dra"][1]
    assert world.cp.admin.get(f"{DEPLOYMENTS}/topoalloc-allocator")["metadata"]["generation"] == allocator
    assert secrets(world) == files
    world.done.add("upgrade")
    world.bound["hashes"] = {"before": before, "after": after}


def test_helm_rollback(world: World) -> None:
    world.need("upgrade")
    helm(world, "rollback", "topoalloc", "1")
    first = world.bound["hashes"]["before"]["topoalloc-agent-dra"][1]
    assert template_hash(world, "topoalloc-agent-dra")[1] == first
    cm = world.cp.admin.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/topoalloc-agent-dra")
    assert yaml.safe_load(cm["data"]["agent.yaml"])["resyncSeconds"] == 10  # the shipped value, not 5
    world.done.add("rollback")


def run_hook_pod(world: World, pod: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """The hook pod's process as the pod runs it: its arguments, with its ServiceAccount's token
    bound to the pod (so the hook's RBAC is what is exercised); a kubeconfig in place of the
    pod's in-cluster service account, the pod's namespace as in the pod."""
    (container,) = pod["spec"]["containers"]
    args = list(container["args"])
    assert args[:2] == ["cleanup", "--in-cluster"], args
    token = service_account_token(world.cp, NAMESPACE, pod["spec"]["serviceAccountName"], bound_pod=pod)
    kubeconfig = world.cp.write_kubeconfig("cleanup-hook", token=token)
    argv = topoalloc_argv("cleanup", *args[2:], "--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE)
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "TOPOALLOC_DEBUG")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, cwd=world.workdir)


def report_ended(world: World, pod: dict[str, Any], code: int) -> None:
    """What kubelet reports of a pod whose one container exited with `code` (restartPolicy Never):
    the Job controller counts it from this."""
    now = pod["metadata"]["creationTimestamp"]
    terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
    status = {
        "phase": "Succeeded" if code == 0 else "Failed",
        "startTime": now,
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": {**terminated, "startedAt": now, "finishedAt": now}},
            }
            for c in pod["spec"]["containers"]
        ],
    }
    world.cp.admin.merge_patch(f"{PODS}/{pod['metadata']['name']}/status", {"status": status})


@contextmanager
def hook_kubelet(world: World) -> Iterator[list[subprocess.CompletedProcess[str]]]:
    """While the block runs, kubelet's part for the hook's Job: each of its pods run once
    (run_hook_pod) and its end reported. Yields the runs."""
    runs: list[subprocess.CompletedProcess[str]] = []
    errors: list[BaseException] = []
    done, seen = threading.Event(), set()

    def loop() -> None:
        while not done.wait(0.5):
            try:
                found = world.cp.admin.get(PODS, labelSelector=f"job-name={HOOK_JOB}")["items"]
                for pod in found:
                    if pod["metadata"]["uid"] in seen or pod["metadata"].get("deletionTimestamp"):
                        continue
                    seen.add(pod["metadata"]["uid"])
                    runs.append(run_hook_pod(world, pod))
                    report_ended(world, pod, runs[-1].returncode)
            except Exception as exc:  # said after the block; the uninstall then times out
                errors.append(exc)
                return

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield runs
    finally:
        done.set()
        thread.join()
    assert not errors, errors


def test_helm_uninstall_cleans_up_and_leaves_crds_and_user_objects(world: World) -> None:
    world.need("install")
    world.cp.create_namespace("team")
    world.cp.create_namespace("train")
    leave_traces(world, device_classes=False)  # the chart installed topoalloc's DeviceClasses
    group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "trainers", "namespace": "team"},
        "spec": {"minMember": 2},
    }
    world.cp.admin.post("/apis/scheduling.x-k8s.io/v1alpha1/namespaces/team/podgroups", group)
    # The hook's Job completes once its pod has run; the agent pods go once kubelet says so.
    with kubelet_ending_deleted_pods(world), hook_kubelet(world) as runs:
        helm(world, "uninstall", "topoalloc")  # not --wait: the namespace goes once its pods do (below)
    assert len(runs) == 1 and runs[0].returncode == 0, runs
    traces_gone(world, runs[0])
    assert "deleted DaemonSet topoalloc-system/topoalloc-agent-dra" in runs[0].stdout, runs[0].stdout

    def namespace_gone() -> bool:  # its pods go first; no kubelet finishes them
        finish_terminating(world.cp)
        return world.gone(f"/api/v1/namespaces/{NAMESPACE}")

    world.wait(namespace_gone, "topoalloc-system deleted", timeout=180)
    for name in OUR_CRDS:
        assert world.established(name)
    assert world.cp.admin.get("/apis/scheduling.x-k8s.io/v1alpha1/namespaces/team/podgroups/trainers")
    left = world.cp.kubectl(
        "get", "all,cm,secret,sa,role,rolebinding,clusterrole,clusterrolebinding,mutatingwebhookconfiguration,"
        "validatingadmissionpolicy,validatingadmissionpolicybinding,pdb,deviceclass", "-A",
        "-l", "app.kubernetes.io/part-of=topoalloc", "-o", "name",
    ).stdout.split()  # fmt: skip
    assert left == []
    with pytest.raises(ApiStatus):
        world.cp.admin.get(f"{WEBHOOKS}/topoalloc-gang")
    assert world.gone(f"{CRDS}/nothing") and not world.gone(f"{CRDS}/{OUR_CRDS[0]}")
