"""What `topoalloc install` applies, rendered without a cluster: labels, order, modes, versions,
certificates, the gang webhook's failure policy, objects another system owns left out."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from topoalloc.commands.installer import manifests, tls
from topoalloc.commands.installer.kustomize import ident
from topoalloc.commands.installer.manifests import ClusterFacts, InstallOptions, render

Doc = dict[str, Any]


def _render(**options: Any) -> list[Doc]:
    certs = options.get("certs", "generate")
    opts = InstallOptions(version="9.9.9", scheduler_version="v1.35.6", **options)
    return render(opts, ClusterFacts(tls=tls.issue_secrets() if certs == "generate" else None))


def _one(docs: list[Doc], kind: str, name: str) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _images(docs: list[Doc]) -> dict[str, list[str]]:
    return {
        d["metadata"]["name"]: [c["image"] for c in d["spec"]["template"]["spec"]["containers"]]
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
    }


def test_secondary_mode_renders_everything_labelled_in_apply_order() -> None:
    docs = _render(mode="secondary")
    assert all(d["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "topoalloc" for d in docs)
    kinds = [d["kind"] for d in docs]
    assert kinds[0] == "Namespace" and kinds.count("Namespace") == 1
    assert kinds[1:3] == ["CustomResourceDefinition"] * 2
    assert kinds[-1] == "MutatingWebhookConfiguration"  # nothing can call it before the rest exists
    assert len({ident(d) for d in docs}) == len(docs)
    assert _images(docs) == {
        "topoalloc-allocator": ["topoalloc:9.9.9"],
        "topoalloc-scheduler": ["registry.k8s.io/kube-scheduler:v1.35.6"],
        "topoalloc-agent": ["topoalloc:9.9.9"],
    }
    secrets = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    assert secrets == {"topoalloc-allocator-tls", "topoalloc-scheduler-client"}


def test_the_agent_runs_on_the_installers_label_too() -> None:
    ds = _one(_render(), "DaemonSet", "topoalloc-agent")
    terms = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    keys = [t["matchExpressions"][0]["key"] for t in terms]
    assert keys == [
        "nvidia.com/gpu.present",
        "feature.node.kubernetes.io/pci-10de.present",
        manifests.GPU_NODE_LABEL,
    ]


@pytest.mark.parametrize(
    ("mode", "policy", "gangs"),
    [
        ("placement", "", "Fail"),
        ("secondary", "", "Ignore"),
        ("kubeadm", "Fail", "Fail"),
        ("placement", "Ignore", "Ignore"),
    ],
)
def test_the_gang_webhooks_failure_policy_and_ca_bundle(mode: str, policy: str, gangs: str) -> None:
    """Placement mode has no extender to hold an ungated member: its gang webhooks fail closed unless
    told otherwise; the extender modes fail open. Every other webhook fails open."""
    docs = _render(mode=mode, gang_failure_policy=policy)
    secret = _one(docs, "Secret", "topoalloc-allocator-tls")
    hooks = _one(docs, "MutatingWebhookConfiguration", "topoalloc-gang")["webhooks"]
    assert ("placement.topoalloc.io" in [h["name"] for h in hooks]) == (mode == "placement")
    for hook in hooks:
        assert hook["failurePolicy"] == (gangs if hook["name"] in manifests.GANG_WEBHOOKS else "Ignore")
        assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    assert base64.b64decode(secret["data"]["ca.crt"]).startswith(b"-----BEGIN CERTIFICATE-----")


def test_placement_mode_is_the_default_with_no_second_scheduler_and_the_allocator_placing() -> None:
    docs = _render()
    assert "topoalloc-scheduler" not in _images(docs)
    args = _one(docs, "Deployment", "topoalloc-allocator")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--no-placement" not in args
    for mode in ("secondary", "kubeadm"):
        args = _one(_render(mode=mode), "Deployment", "topoalloc-allocator")["spec"]["template"]["spec"][
            "containers"
        ][0]["args"]
        assert args[-1] == "--no-placement"


def test_kubeadm_mode_has_no_second_scheduler() -> None:
    docs = _render(mode="kubeadm")
    assert not [d for d in docs if "topoalloc-scheduler" in d["metadata"]["name"] and d["kind"] != "Secret"]
    assert set(_images(docs)) == {"topoalloc-allocator", "topoalloc-agent"}


def test_cert_manager_issues_the_secrets() -> None:
    docs = _render(certs="cert-manager")
    assert not [d for d in docs if d["kind"] == "Secret"]
    certificates = {d["metadata"]["name"] for d in docs if d["kind"] == "Certificate"}
    assert {"topoalloc-allocator-tls", "topoalloc-scheduler-client"} <= certificates
    hooks = _one(docs, "MutatingWebhookConfiguration", "topoalloc-gang")["webhooks"]
    assert all("caBundle" not in h["clientConfig"] for h in hooks)  # the leader keeps it


def test_image_repository_and_nvidia_runtime_class() -> None:
    docs = _render(image="registry.example.com/ml/topoalloc", nvidia_runtime_class=True)
    assert _images(docs)["topoalloc-agent"] == ["registry.example.com/ml/topoalloc:9.9.9"]
    assert (
        _one(docs, "DaemonSet", "topoalloc-agent")["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    )


def test_objects_another_system_owns_are_left_out() -> None:
    opts = InstallOptions(version="1", scheduler_version="v1.35.6")
    foreign = {
        ("apiextensions.k8s.io", "CustomResourceDefinition", "", "devices.scheduling.koordinator.sh"),
        ("", "Namespace", "", "topoalloc-system"),
    }
    docs = render(opts, ClusterFacts(foreign=foreign))
    assert not {ident(d) for d in docs} & foreign
    assert _one(docs, "CustomResourceDefinition", "podgroups.scheduling.x-k8s.io")


def test_the_record_round_trips_the_options() -> None:
    opts = InstallOptions(
        version="0.3.0",
        image="reg/topoalloc",
        mode="kubeadm",
        certs="cert-manager",
        gang_failure_policy="Fail",
        nvidia_runtime_class=True,
        scheduler_version="",
    )
    record = _one(render(opts, ClusterFacts()), "ConfigMap", manifests.RECORD)
    assert record["data"]["version"] == "0.3.0" and record["data"]["nvidiaRuntimeClass"] == "true"
    assert InstallOptions.from_record(record["data"]) == opts


def test_uninstall_looks_for_every_kind_an_installation_makes() -> None:
    kinds = manifests.kinds()
    rendered = {
        (d["apiVersion"], d["kind"]) for d in _render() + _render(mode="kubeadm", certs="cert-manager")
    }
    assert rendered <= set(kinds)
    assert kinds[0] == ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration")


def test_the_installed_allocator_may_read_disruption_budgets() -> None:
    """Preemption chooses victims around PodDisruptionBudgets: the installer's ClusterRole lets the
    allocator list and watch them (deploy/allocator/rbac.yaml)."""
    role = _one(_render(), "ClusterRole", "topoalloc-allocator")
    budgets = [r for r in role["rules"] if "poddisruptionbudgets" in r["resources"]]
    assert budgets and budgets[0]["apiGroups"] == ["policy"]
    assert {"list", "watch"} <= set(budgets[0]["verbs"])
