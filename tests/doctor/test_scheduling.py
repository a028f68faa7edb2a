"""Scheduler wiring on constructed objects, per install mode: placement (the placement webhook there,
the allocator placing); secondary (the second scheduler ready, its configuration's extender the
allocator's Service with a pod behind it); kubeadm (the copied configuration naming the allocator
Service's ClusterIP, the cluster's kube-scheduler pods run with it). A configuration naming an
extender that is not there fails, with what it does to pods and the fix."""

from __future__ import annotations

import copy

import yaml

from tests.doctor.healthy import CLUSTER_IP, REPO, facts, pod
from topoalloc.commands.doctor import scheduling
from topoalloc.commands.doctor.facts import Facts, SchedulerConfig
from topoalloc.commands.doctor.findings import FAIL, OK, WARN


def statuses(found: list) -> list[str]:
    return [f.status for f in found]


def kubeadm_config(url: str) -> SchedulerConfig:
    text = (REPO / "deploy/kube-scheduler/kube-scheduler-config.yaml").read_text()
    return SchedulerConfig(
        "file topoalloc-kubeadm/kube-scheduler-config.yaml",
        text.replace("https://ALLOCATOR_CLUSTER_IP:8443", url),
    )


def extender_mode(f: Facts, mode: str) -> Facts:
    f.record = {"mode": mode}
    f.webhooks["webhooks"] = [h for h in f.webhooks["webhooks"] if h["name"] != "placement.topoalloc.io"]
    f.deployments["topoalloc-allocator"]["spec"]["template"]["spec"]["containers"][0]["args"].append(
        "--no-placement"
    )
    return f


def test_placement_mode_wired_passes() -> None:
    [found] = scheduling.check(facts())
    assert found.status == OK and found.what.startswith("placement mode: GPU pods are gated at admission")


def test_placement_mode_without_its_webhook_or_with_the_allocator_not_placing_fails() -> None:
    f = facts()
    f.webhooks["webhooks"] = [h for h in f.webhooks["webhooks"] if h["name"] != "placement.topoalloc.io"]
    f.deployments["topoalloc-allocator"]["spec"]["template"]["spec"]["containers"][0]["args"].append(
        "--no-placement"
    )
    found = scheduling.check(f)
    assert statuses(found) == [FAIL, FAIL]
    assert "has no placement.topoalloc.io" in found[0].what and "without placement" in found[1].what


def test_kubeadm_mode_a_configuration_naming_a_missing_extender_fails() -> None:
    f = extender_mode(facts(), "kubeadm")
    f.scheduler_configs = [kubeadm_config("https://10.96.0.99:8443")]
    [found] = scheduling.check(f)
    assert found.status == FAIL
    assert found.what == (
        "kube-scheduler's extender https://10.96.0.99:8443 (file topoalloc-kubeadm/kube-scheduler-config.yaml) "
        "is missing: no Service of this cluster has the ClusterIP 10.96.0.99; every pod asking for a device it "
        "manages fails to schedule"
    )
    assert found.fix.startswith("topoalloc install --mode kubeadm writes it anew")


def test_kubeadm_mode_a_configuration_naming_the_allocator_passes_unless_nothing_leads() -> None:
    f = extender_mode(facts(), "kubeadm")
    f.scheduler_configs = [kubeadm_config(f"https://{CLUSTER_IP}:8443")]
    [found] = scheduling.check(f)
    assert found.status == OK and "serving topoalloc-allocator-0" in found.what
    del f.pods[0]["metadata"]["labels"]["topoalloc.io/leader"]
    [found] = scheduling.check(f)
    assert found.status == FAIL and "selects no pod" in found.what
    f.scheduler_configs = [kubeadm_config(f"https://{CLUSTER_IP}:9999")]
    assert "has no port 9999" in scheduling.check(f)[0].what


def test_kubeadm_mode_without_the_file_warns_and_a_scheduler_pod_without_the_config_fails() -> None:
    f = extender_mode(facts(), "kubeadm")
    [found] = scheduling.check(f)
    assert found.status == WARN and "pass --scheduler-config FILE" in found.fix
    scheduler = pod("kube-scheduler-cp-1", "kube-system", {"component": "kube-scheduler"}, "cp-1")
    scheduler["spec"]["containers"][0]["command"] = [
        "kube-scheduler",
        "--kubeconfig=/etc/kubernetes/scheduler.conf",
    ]
    f.pods.append(scheduler)
    assert statuses(scheduling.check(f)) == [FAIL, WARN]
    scheduler["spec"]["containers"][0]["command"].append(
        "--config=/etc/kubernetes/topoalloc/kube-scheduler-config.yaml"
    )
    assert statuses(scheduling.check(f)) == [WARN]


def test_an_extender_mode_with_the_placement_webhook_left_fails() -> None:
    f = extender_mode(facts(), "kubeadm")
    f.webhooks = facts().webhooks
    assert "still has placement.topoalloc.io" in scheduling.check(f)[0].what


def _secondary(f: Facts, url: str) -> Facts:
    extender_mode(f, "secondary")
    config = yaml.safe_load((REPO / "deploy/secondary-scheduler/scheduler-config.yaml").read_text())
    config["data"]["config.yaml"] = config["data"]["config.yaml"].replace(
        "https://topoalloc-allocator.topoalloc-system.svc:8443", url
    )
    f.configmaps["topoalloc-scheduler"] = config
    f.deployments["topoalloc-scheduler"] = {
        "metadata": {"name": "topoalloc-scheduler"},
        "status": {"readyReplicas": 2},
    }
    return f


def test_secondary_mode_reaches_the_allocator_by_its_service_name() -> None:
    f = _secondary(facts(), "https://topoalloc-allocator.topoalloc-system.svc:8443")
    [found] = scheduling.check(f)
    assert (
        found.status == OK
        and "(ConfigMap topoalloc-system/topoalloc-scheduler) is the allocator's Service" in found.what
    )
    f = _secondary(facts(), "https://topoalloc-extender.topoalloc-system.svc:8443")
    [found] = scheduling.check(f)
    assert found.status == FAIL and "Service topoalloc-system/topoalloc-extender does not exist" in found.what


def test_secondary_mode_without_its_scheduler_fails() -> None:
    f = _secondary(facts(), "https://topoalloc-allocator.topoalloc-system.svc:8443")
    f.deployments["topoalloc-scheduler"]["status"] = {}
    assert statuses(scheduling.check(f)) == [FAIL, OK]
    del f.deployments["topoalloc-scheduler"]
    [found] = scheduling.check(f)
    assert found.status == FAIL and "no Deployment topoalloc-system/topoalloc-scheduler" in found.what


def test_a_configuration_that_does_not_read_or_names_no_extender_fails() -> None:
    f = facts()
    f.scheduler_configs = [SchedulerConfig("file x.yaml", "extenders: [")]
    assert "does not read" in scheduling.check(f)[-1].what
    f.scheduler_configs = [SchedulerConfig("file x.yaml", "kind: KubeSchedulerConfiguration\n")]
    assert "names no extender" in scheduling.check(f)[-1].what
    local = copy.deepcopy(kubeadm_config("https://127.0.0.1:8443"))
    f.scheduler_configs = [local]
    assert scheduling.check(f)[-1].status == WARN  # not a Service address: cannot be told


def uninstalled(f: Facts) -> Facts:
    """What is left once topoalloc is uninstalled: no record, allocator, webhooks or Services."""
    f.record, f.deployments, f.webhooks = {}, {}, None
    f.services = [s for s in f.services if s["metadata"].get("namespace") != "topoalloc-system"]
    f.pods = [p for p in f.pods if p["metadata"].get("namespace") != "topoalloc-system"]
    return f


def test_uninstalled_a_kube_scheduler_still_started_with_the_copied_configuration_fails() -> None:
    f = uninstalled(facts())
    assert f.mode()[0] == "no" and scheduling.check(f) == []
    scheduler = pod("kube-scheduler-cp-1", "kube-system", {"component": "kube-scheduler"}, "cp-1")
    scheduler["spec"]["containers"][0]["command"] = [
        "kube-scheduler",
        "--config=/etc/kubernetes/topoalloc/kube-scheduler-config.yaml",
    ]
    f.pods.append(scheduler)
    [found] = scheduling.check(f)
    assert found.status == FAIL
    assert found.what == (
        "kube-scheduler kube-scheduler-cp-1 runs with topoalloc's configuration "
        "(/etc/kubernetes/topoalloc/kube-scheduler-config.yaml: an extender with ignorable: false) but no "
        "allocator is installed: every pod asking for a GPU or RDMA device fails to schedule"
    )
    assert "remove --config=/etc/kubernetes/topoalloc/kube-scheduler-config.yaml" in found.fix
    # The copied file, given (or left in --kubeadm-dir): its extender names a Service that is gone.
    f.scheduler_configs = [kubeadm_config(f"https://{CLUSTER_IP}:8443")]
    found = scheduling.check(f)
    assert statuses(found) == [FAIL, FAIL]
    assert f"no Service of this cluster has the ClusterIP {CLUSTER_IP}" in found[1].what
    assert found[1].fix.startswith("remove that extender from the configuration")
