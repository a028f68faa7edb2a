"""`topoalloc install`, `upgrade` and `uninstall` on a bare control plane of each release (issue 31).

The module starts its own control plane (the session's has the harness's manifests applied; an
installer must start from an empty cluster): etcd, kube-apiserver, the default kube-scheduler with
no configuration of topoalloc's (placement mode needs none) and kube-controller-manager, whose
DaemonSet and Deployment controllers create the installed pods. No kubelet runs them, so
tests/support/installed.py runs what each pod would run, with the credentials, Secrets and
ConfigMaps the installation put there, and stands in for the Services' endpoints that
kube-apiserver calls the installed webhooks through (kube-proxy and pod IPs on a cluster). Three
nodes: gpu-a labelled by GPU Feature Discovery (a DGX H100), gpu-b with GPUs but no label (4x A100,
NVLink pairs), cpu-1.

The steps build on each other, in order: README's Deploy commands on the empty cluster (placement
mode: the GPU pod gated at admission, placed by the allocator, bound by the control plane's own
kube-scheduler), the GPU node label and a device plugin conflict, a gang whose members are refused
while no allocator runs and bind whole once it does, an upgrade with running allocations, a
downgrade and settings changed outside topoalloc refused before anything is applied, secondary
mode (a second kube-scheduler), kubeadm mode, uninstall, --purge (with a Koordinator-owned CRD).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.apis.paths import require_shared
from tests.cluster.harness import allocated, gpu_minors
from tests.cluster.install_world import (
    ALLOCATED_NODE,
    CRDS,
    DEPLOYMENTS,
    DEVICES,
    PODGROUPS,
    WEBHOOKS,
    World,
    member,
    open_world,
    solo,
)
from tests.deploy.test_readme import DEPLOY, README, _commands, section
from tests.support.controlplane import REPO, ApiStatus
from tests.support.installed import NAMESPACE, finish_terminating
from tests.support.kube_releases import KubeRelease

UPGRADE_TO = "0.1.1"
GANG_GATE = "topoalloc.io/gang"


@pytest.fixture(scope="module")
def world(release: KubeRelease, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    require_shared(release.missing_parts())
    with open_world(release, tmp_path_factory.mktemp(f"install-{release.minor}")) as opened:
        yield opened


def test_the_scheduler_pin_follows_the_servers_version_and_the_skew_policy(world: World) -> None:
    server = world.cp.admin.get("/version")["gitVersion"]
    major, minor = (int(x) for x in server.lstrip("v").split(".")[:2])

    def rendered(*flags: str) -> list[dict[str, Any]]:
        return list(yaml.safe_load_all(world.topoalloc("install", "--dry-run", *flags).stdout))

    def image(*flags: str) -> str:
        docs = rendered("--mode", "secondary", *flags)
        scheduler = next(
            d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "topoalloc-scheduler"
        )
        return str(scheduler["spec"]["template"]["spec"]["containers"][0]["image"])

    # Placement mode, the default, runs no scheduler of its own and configures none: no pin.
    docs = rendered()
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"] == ["topoalloc-allocator"]
    images = {
        c["image"]
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"topoalloc:0.1.0"}, images
    ran = world.topoalloc("install", "--dry-run", "--scheduler-version", server, check=False)
    assert ran.returncode == 2 and "--mode secondary" in ran.stderr, ran.stderr
    # Secondary mode's second scheduler is pinned to the server's version, within the skew policy.
    assert image() == f"registry.k8s.io/kube-scheduler:{server}"
    assert (
        image("--scheduler-version", f"v{major}.{minor - 1}.4")
        == f"registry.k8s.io/kube-scheduler:v{major}.{minor - 1}.4"
    )
    for version, why in (
        (f"v{major}.{minor + 1}.0", "newer than kube-apiserver"),
        (f"v{major}.{minor - 2}.0", "at most one"),
    ):
        ran = world.topoalloc(
            "install", "--dry-run", "--mode", "secondary", "--scheduler-version", version, check=False
        )
        assert ran.returncode == 2 and why in ran.stderr, ran.stderr
    # A dry run changes nothing.
    with pytest.raises(ApiStatus):
        world.cp.admin.get(f"/api/v1/namespaces/{NAMESPACE}")
    # A user RBAC allows nothing: one line, exit 1, no traceback.
    nobody = world.cp.client_identity("nobody", "nobody")
    ran = world.topoalloc("install", "--kubeconfig", str(nobody), check=False)
    assert ran.returncode == 1 and ran.stderr.count("\n") == 1, ran.stderr
    assert ran.stderr.startswith(f"error: cluster ({world.cp.url}): HTTP 403") and "forbidden" in ran.stderr


def test_readme_deploy_places_a_gpu_pod_on_an_empty_cluster(world: World) -> None:
    """Exactly README's Deploy commands; between `install` and the pod, the installed pods'
    processes start (what kubelet would do). Placement mode: the pod, of the default scheduler, is
    gated at admission, placed by the allocator and bound by the control plane's own kube-scheduler,
    of which nothing was configured."""
    block = _commands(section("Deploy", README).split("Upgrade and removal")[0])
    assert [c.split()[0] for c in block] == [
        "make",
        ".venv/bin/topoalloc",
        ".venv/bin/topoalloc",
        "kubectl",
        "kubectl",
        ".venv/bin/topoalloc",
    ]
    outputs = {}
    for command in block:
        if command.startswith("kubectl get"):
            world.wait_bound("default", "gpu-pod")
        outputs[command] = world.readme_step(command)
        if command == ".venv/bin/topoalloc install":
            world.start_installed()
    install = outputs[".venv/bin/topoalloc install"]
    assert install is not None
    assert "agent: on 1 of 3 nodes: gpu-a (nvidia.com/gpu.present)" in install.stdout, install.stdout
    assert "nodes advertising nvidia.com/gpu without a GPU label (no agent there): gpu-b" in install.stderr
    assert "scheduler: the cluster's own kube-scheduler, unchanged" in install.stdout, install.stdout
    assert "gang webhook: failurePolicy Fail" in install.stdout, install.stdout
    # The DaemonSet controller put agent pods exactly where the report said.
    ds = world.cp.admin.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/topoalloc-agent")
    assert ds["status"]["desiredNumberScheduled"] == 1 and world.agent_nodes() == {"gpu-a"}
    # No second scheduler: the allocator is the only Deployment, started in placement mode.
    deployments = world.cp.admin.get(DEPLOYMENTS)["items"]
    assert [d["metadata"]["name"] for d in deployments] == ["topoalloc-allocator"]
    pod = world.bound["default/gpu-pod"]
    assert pod["spec"]["nodeName"] == "gpu-a" and len(gpu_minors(pod)) == 2
    # Placed at admission (the allocator's pin, the node its devices were chosen on), whatever its
    # scheduler, and bound by the control plane's own kube-scheduler.
    assert pod["spec"].get("schedulerName") == "default-scheduler"
    assert pod["metadata"]["annotations"][ALLOCATED_NODE] == "gpu-a"
    assert world.bound_by("default", "gpu-pod") == "default-scheduler"
    shown = outputs["kubectl get pod gpu-pod -o wide"]
    assert shown is not None and "gpu-a" in shown.stdout
    explained = outputs[".venv/bin/topoalloc explain pod default/gpu-pod"]
    assert explained is not None and "allocation: made for gpu-a" in explained.stdout, explained.stdout
    world.done.add("deploy")


def test_gpu_nodes_get_the_agent_and_a_device_plugin_is_reported(world: World) -> None:
    world.need("deploy")
    world.start_nvidia_device_plugin()
    ran = world.topoalloc("install", "--gpu-nodes", "gpu-b")
    assert (
        "agent: on 2 of 3 nodes: gpu-a (nvidia.com/gpu.present), gpu-b (topoalloc.io/gpu-node)" in ran.stdout
    )
    assert (
        "node gpu-a: the NVIDIA device plugin (DaemonSet gpu-operator/nvidia-device-plugin-daemonset) runs there"
        in ran.stderr
    )
    assert world.cp.admin.get("/api/v1/nodes/gpu-b")["metadata"]["labels"]["topoalloc.io/gpu-node"] == "true"
    world.wait(lambda: world.agent_nodes() == {"gpu-a", "gpu-b"}, "agent pods on gpu-a and gpu-b")
    world.installed.start_agents()
    world.wait(lambda: world.cp.admin.get(f"{DEVICES}/gpu-b").get("status") or None, "Device gpu-b")
    world.cp.admin.delete("/api/v1/namespaces/gpu-operator")
    world.done.add("gpu-nodes")


def test_gang_members_are_refused_while_no_allocator_runs_and_bind_whole_once_it_does(world: World) -> None:
    world.need("gpu-nodes")
    hooks = world.cp.admin.get(f"{WEBHOOKS}/topoalloc-gang")["webhooks"]
    assert {h["name"]: h["failurePolicy"] for h in hooks}["podgroup.gang.topoalloc.io"] == "Fail"
    world.installed.stop_allocator()
    world.cp.create_namespace("train")
    world.cp.admin.post(
        PODGROUPS.format(ns="train"),
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "trainers"},
            "spec": {"minMember": 2},
        },
    )
    # Nothing answers the gang webhook, which fails closed: the member is refused, not created
    # ungated, so no gang binds in part.
    with pytest.raises(ApiStatus) as refused:
        world.cp.admin.post("/api/v1/namespaces/train/pods", member("m0", 4))
    assert "podgroup.gang.topoalloc.io" in refused.value.message, refused.value.message
    with pytest.raises(ApiStatus):
        world.pod("train", "m0")
    world.installed.start_allocator()
    # Created again (what a Job's controller does), each member is gated until its gang is placed.
    for name in ("m0", "m1"):
        created = world.cp.admin.post("/api/v1/namespaces/train/pods", member(name, 4))
        assert GANG_GATE in [g["name"] for g in created["spec"].get("schedulingGates") or []], created["spec"]
    members = [world.wait_bound("train", n) for n in ("m0", "m1")]
    assert sorted(m["spec"]["nodeName"] for m in members) == ["gpu-a", "gpu-b"]
    used = [
        (p["spec"]["nodeName"], g) for p in [*members, world.bound["default/gpu-pod"]] for g in gpu_minors(p)
    ]
    assert len(used) == len(set(used)) == 10
    world.done.add("gang")


def test_upgrade_rolls_the_agent_and_allocator_and_keeps_allocations(world: World) -> None:
    world.need("gang")
    before = {key: allocated(world.pod(*key.split("/"))) for key in world.bound}
    ds_path = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/topoalloc-agent"
    state_volume = _volume(world.cp.admin.get(ds_path), "state")
    upgrade = next(c for c in DEPLOY if c.startswith(".venv/bin/topoalloc upgrade"))
    ran = world.topoalloc(*shlex.split(upgrade)[1:], "--version", UPGRADE_TO)
    assert f"upgrade: topoalloc:0.1.0 -> topoalloc:{UPGRADE_TO}" in ran.stdout
    ds = world.cp.admin.get(ds_path)
    deployment = world.cp.admin.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/topoalloc-allocator")
    for obj in (ds, deployment):
        assert obj["spec"]["template"]["spec"]["containers"][0]["image"] == f"topoalloc:{UPGRADE_TO}"
    assert _volume(ds, "state") == state_volume  # the checkpoint's hostPath stays where it was

    def rolled() -> bool:  # kubelet's part: a deleted pod goes once its containers stopped
        finish_terminating(world.cp)
        status = world.cp.admin.get(ds_path)["status"]
        return status.get("updatedNumberScheduled") == status.get("desiredNumberScheduled") == 2

    world.wait(rolled, "the agent DaemonSet rolled to the new version", timeout=120)
    world.installed.stop_agents()
    world.installed.start_agents()  # the new pods' processes, with tokens bound to them
    world.installed.start_allocator()
    after = {key: allocated(world.pod(*key.split("/"))) for key in world.bound}
    assert after == before
    # The new allocator counts them as used: the 2 GPUs still free on gpu-a, no GPU twice.
    world.cp.admin.post("/api/v1/namespaces/train/pods", solo("after-upgrade", 2))
    pod = world.wait_bound("train", "after-upgrade")
    taken = {
        g
        for key, p in world.bound.items()
        if key != "train/after-upgrade" and p["spec"]["nodeName"] == "gpu-a"
        for g in gpu_minors(p)
    }
    assert pod["spec"]["nodeName"] == "gpu-a" and not set(gpu_minors(pod)) & taken
    world.done.add("upgrade")


def test_upgrade_refuses_a_downgrade_and_settings_changed_outside_topoalloc(world: World) -> None:
    """A lower version only with --allow-downgrade; the agent's ConfigMap edited with `kubectl
    replace` (docs/dra.md's `mode: dra`) stops the upgrade before anything is applied, naming the
    setting; --force-conflicts puts the installation's value back and says so."""
    world.need("upgrade")
    agent_config = f"/api/v1/namespaces/{NAMESPACE}/configmaps/topoalloc-agent"
    watched = [
        f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/topoalloc-agent",
        f"{DEPLOYMENTS}/topoalloc-allocator",
        f"/api/v1/namespaces/{NAMESPACE}/configmaps/topoalloc-install",
        agent_config,
    ]

    def versions() -> list[str]:
        return [world.cp.admin.get(path)["metadata"]["resourceVersion"] for path in watched]

    before = versions()
    ran = world.topoalloc("upgrade", "--version", "0.1.0", check=False)
    assert ran.returncode == 2 and ran.stdout == "", ran
    assert ran.stderr.startswith(f"error: upgrade ({UPGRADE_TO} -> 0.1.0): 0.1.0 is older than the installed")
    assert "--allow-downgrade" in ran.stderr
    dry = world.topoalloc("upgrade", "--version", "0.1.0", "--allow-downgrade", "--dry-run")
    assert f"warning: downgrading from {UPGRADE_TO} to 0.1.0" in dry.stderr
    assert "changed outside topoalloc" not in dry.stderr  # every object applies cleanly as a dry run
    assert versions() == before

    edited = world.cp.admin.get(agent_config)
    edited["metadata"].pop("managedFields", None)
    edited["data"]["agent.yaml"] = edited["data"]["agent.yaml"].replace("mode: device-plugin", "mode: dra")
    world.cp.kubectl("replace", "-f", "-", input=yaml.safe_dump(edited))
    before = versions()
    ran = world.topoalloc("upgrade", "--version", UPGRADE_TO, check=False)
    assert ran.returncode == 1 and "upgrade: " in ran.stdout, ran
    named = (
        f"ConfigMap {NAMESPACE}/topoalloc-agent: .data.agent.yaml changed by kubectl-replace "
        "(agent.yaml: mode is dra in the cluster, device-plugin in the installation)"
    )
    assert (
        ran.stderr.startswith("error: apply (")
        and "settings changed outside topoalloc, nothing applied: " in ran.stderr
    )
    assert named in ran.stderr and "--set KEY=VALUE or --values FILE" in ran.stderr, ran.stderr
    assert versions() == before  # not one object applied
    assert "mode: dra" in world.cp.admin.get(agent_config)["data"]["agent.yaml"]

    ran = world.topoalloc("upgrade", "--version", UPGRADE_TO, "--force-conflicts")
    assert f"warning: {named}: overwritten (--force-conflicts)" in ran.stderr, ran.stderr
    assert "mode: device-plugin" in world.cp.admin.get(agent_config)["data"]["agent.yaml"]
    again = world.topoalloc("upgrade", "--version", UPGRADE_TO)  # the installer owns the field again
    assert "changed outside topoalloc" not in again.stderr
    world.done.add("conflicts")


def _volume(ds: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == name)


def test_secondary_mode_runs_a_second_scheduler_for_the_pods_that_name_it(world: World) -> None:
    world.need("upgrade")
    world.cp.admin.delete("/api/v1/namespaces/train/pods/after-upgrade", gracePeriodSeconds=0)
    world.bound.pop("train/after-upgrade")
    server = world.cp.admin.get("/version")["gitVersion"]
    ran = world.topoalloc("install", "--mode", "secondary", "--version", UPGRADE_TO)
    assert f"scheduler: a second kube-scheduler registry.k8s.io/kube-scheduler:{server}" in ran.stdout
    # The extender variant: no placement webhook, the gang webhooks fail open, the allocator's pods
    # roll to --no-placement.
    hooks = world.webhook_policies()
    assert "placement.topoalloc.io" not in hooks and hooks["podgroup.gang.topoalloc.io"] == "Ignore"
    scheduler = world.cp.admin.get(f"{DEPLOYMENTS}/topoalloc-scheduler")
    assert scheduler["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"registry.k8s.io/kube-scheduler:{server}"
    )
    world.installed.start_allocator()
    assert "--no-placement" in world.installed.current_pod()["spec"]["containers"][0]["args"]
    world.installed.start_scheduler()
    world.cp.admin.post(
        "/api/v1/namespaces/train/pods", solo("secondary-pod", 2, scheduler="topoalloc-scheduler")
    )
    pod = world.wait_bound("train", "secondary-pod")
    taken = {
        g
        for key, p in world.bound.items()
        if key != "train/secondary-pod" and p["spec"]["nodeName"] == "gpu-a"
        for g in gpu_minors(p)
    }
    assert (
        pod["spec"]["nodeName"] == "gpu-a" and len(gpu_minors(pod)) == 2 and not set(gpu_minors(pod)) & taken
    )
    assert world.bound_by("train", "secondary-pod") == "topoalloc-scheduler"
    world.done.add("secondary")


def test_kubeadm_mode_hooks_up_the_clusters_own_scheduler(world: World) -> None:
    world.need("secondary")
    world.cp.admin.delete("/api/v1/namespaces/train/pods/secondary-pod", gracePeriodSeconds=0)
    world.bound.pop("train/secondary-pod")
    folder = world.workdir / "kubeadm"
    ran = world.topoalloc(
        "install", "--mode", "kubeadm", "--version", UPGRADE_TO, "--kubeadm-dir", str(folder)
    )
    service = world.cp.admin.get(f"/api/v1/namespaces/{NAMESPACE}/services/topoalloc-allocator")
    cluster_ip = service["spec"]["clusterIP"]
    assert f"allocator Service ClusterIP: {cluster_ip}" in ran.stdout
    assert "Deployment topoalloc-system/topoalloc-scheduler" in ran.stdout  # pruned: no second scheduler
    with pytest.raises(ApiStatus):
        world.cp.admin.get(f"{DEPLOYMENTS}/topoalloc-scheduler")
    hooks = world.webhook_policies()  # extender mode: as in secondary mode
    assert "placement.topoalloc.io" not in hooks and hooks["podgroup.gang.topoalloc.io"] == "Ignore"
    # A plain re-run keeps the recorded mode (and version), not the defaults.
    again = world.topoalloc("install", "--version", UPGRADE_TO, "--kubeadm-dir", str(folder))
    assert "allocator Service ClusterIP" in again.stdout and "removed" not in again.stdout
    config = yaml.safe_load((folder / "kube-scheduler-config.yaml").read_text())
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == f"https://{cluster_ip}:8443"
    # The cluster's own kube-scheduler with exactly these files (paths and the ClusterIP moved to
    # where this machine has them: no kube-proxy here) places a default-scheduler pod.
    world.installed.stop_scheduler()
    world.cp.stop_scheduler()
    assert world.installed.forwarder is not None
    extender["urlPrefix"] = f"https://127.0.0.1:{world.installed.forwarder.port}"
    for key in ("caFile", "certFile", "keyFile"):
        extender["tlsConfig"][key] = str(folder / Path(extender["tlsConfig"][key]).name)
    config.pop("clientConnection")
    world.cp.start_scheduler(config)
    world.cp.admin.post(
        "/api/v1/namespaces/train/pods", solo("kubeadm-pod", 2, scheduler="default-scheduler")
    )
    pod = world.wait_bound("train", "kubeadm-pod")
    assert pod["spec"]["nodeName"] == "gpu-a" and len(gpu_minors(pod)) == 2
    assert ALLOCATED_NODE not in pod["metadata"]["annotations"]  # the extender bound it, not placement
    world.done.add("kubeadm")


def test_uninstall_keeps_crds_devices_and_podgroups_and_leaves_no_webhook(world: World) -> None:
    world.need("deploy")
    world.installed.stop()  # deleting the workloads stops their pods
    uninstall = next(c for c in DEPLOY if c == ".venv/bin/topoalloc uninstall")
    ran = world.topoalloc(*shlex.split(uninstall)[1:])
    assert ran.stdout.splitlines()[0] == "deleted MutatingWebhookConfiguration topoalloc-gang"
    kept = "devices.scheduling.koordinator.sh, podgroups.scheduling.x-k8s.io, reservations.scheduling.koordinator.sh"
    assert f"kept CRDs {kept}" in ran.stdout, ran.stdout
    with pytest.raises(ApiStatus):
        world.cp.admin.get(f"{WEBHOOKS}/topoalloc-gang")
    assert {d["metadata"]["name"] for d in world.cp.admin.get(DEVICES)["items"]} == {"gpu-a", "gpu-b"}
    if "gang" in world.done:
        assert world.cp.admin.get(f"{PODGROUPS.format(ns='train')}/trainers")["spec"]["minMember"] == 2
    # Pods are created without any webhook in the way, and the namespace goes with its pods.
    world.cp.admin.post("/api/v1/namespaces/train/pods", member("late", 1))
    world.wait(
        lambda: finish_terminating(world.cp) >= 0 and world.gone(f"/api/v1/namespaces/{NAMESPACE}"),
        "namespace gone",
    )
    assert world.ours() == [
        f"customresourcedefinition.apiextensions.k8s.io/{n}"
        for n in (
            "devices.scheduling.koordinator.sh",
            "podgroups.scheduling.x-k8s.io",
            "reservations.scheduling.koordinator.sh",
        )
    ]
    world.done.add("uninstall")


def test_purge_removes_everything_it_created_and_nothing_else(world: World) -> None:
    world.need("uninstall")
    world.cp.admin.post(
        "/api/v1/namespaces/default/configmaps",
        {"metadata": {"name": "not-ours", "labels": {"app.kubernetes.io/part-of": "topoalloc"}}},
    )
    purge = next(c for c in DEPLOY if c == ".venv/bin/topoalloc uninstall --purge")
    ran = world.topoalloc(*shlex.split(purge)[1:])
    assert "removed label topoalloc.io/gpu-node from node gpu-b" in ran.stdout
    for crd in (
        "devices.scheduling.koordinator.sh",
        "podgroups.scheduling.x-k8s.io",
        "reservations.scheduling.koordinator.sh",
    ):
        world.wait(lambda c=crd: world.gone(f"{CRDS}/{c}"), f"CRD {crd} gone")
    assert world.ours() == []
    assert "topoalloc.io/gpu-node" not in world.cp.admin.get("/api/v1/nodes/gpu-b")["metadata"]["labels"]
    world.cp.admin.get("/api/v1/namespaces/default/configmaps/not-ours")

    # Koordinator installed the Device CRD and someone made the namespace (no installer label on
    # either): install leaves both as they are, and purge deletes neither.
    path = REPO / "deploy" / "crds" / "devices.scheduling.koordinator.sh.yaml"
    koordinator = yaml.safe_load(path.read_text())
    koordinator["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "koordinator"}
    world.cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(koordinator))
    world.wait(lambda: world.established("devices.scheduling.koordinator.sh"), "Koordinator's CRD")
    world.cp.create_namespace(NAMESPACE, labels={"team": "platform"})
    ran = world.topoalloc("install")
    for kind, name in (
        ("CustomResourceDefinition", "devices.scheduling.koordinator.sh"),
        ("Namespace", NAMESPACE),
    ):
        assert f"{kind} {name}: exists and was not created by the installer" in ran.stdout, ran.stdout
    crd = world.cp.admin.get(f"{CRDS}/devices.scheduling.koordinator.sh")
    assert crd["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "koordinator"}
    world.topoalloc(*shlex.split(purge)[1:])
    for crd in ("podgroups.scheduling.x-k8s.io", "reservations.scheduling.koordinator.sh"):
        world.wait(lambda c=crd: world.gone(f"{CRDS}/{c}"), f"CRD {crd} gone")
    assert world.ours() == []
    crd = world.cp.admin.get(f"{CRDS}/devices.scheduling.koordinator.sh")
    assert crd["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "koordinator"}
    namespace = world.cp.admin.get(f"/api/v1/namespaces/{NAMESPACE}")
    assert namespace["status"]["phase"] == "Active" and namespace["metadata"]["labels"]["team"] == "platform"
