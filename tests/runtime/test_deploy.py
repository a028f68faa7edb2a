"""The manifests in deploy/ agree with the code: settings the service accepts, probe paths it
serves, the scheduler's extender block, certificate names, and RBAC for every API call it makes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from allocator.extender.app import HEALTH_PATHS, VERBS
from allocator.runtime import certs
from allocator.runtime.admission_settings import WEBHOOK_SERVICE
from allocator.runtime.config import DEFAULT_NAMESPACE, DEFAULT_SERVICE, ServiceConfig
from allocator.runtime.leader import LEADER_LABEL
from apis import resources as rn

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def one(path: Path, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs(path) if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{path}: {kind} {name}"
    return found[0]


def allocator_config() -> ServiceConfig:
    cm = one(DEPLOY / "allocator" / "config.yaml", "ConfigMap")
    return ServiceConfig.from_mapping(yaml.safe_load(cm["data"]["allocator.yaml"]))


def test_configmap_is_a_valid_service_config_matching_the_mounts() -> None:
    cfg = allocator_config()
    dep = one(DEPLOY / "allocator" / "deployment.yaml", "Deployment")
    pod = dep["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in (cfg.tls_cert, cfg.tls_key, cfg.client_ca):
        assert Path(path).parent == Path(mounts["tls"])
    assert volumes["tls"]["secret"]["secretName"] == "topoalloc-allocator-tls"
    assert cfg.in_cluster and cfg.leader_election.label_pod
    assert cfg.allowed_clients == [f"CN={certs.SCHEDULER_CLIENT_CN}"]
    ports = {p["name"]: p["containerPort"] for p in pod["containers"][0]["ports"]}
    assert ports == {"https": cfg.port, "http-metrics": cfg.health_port, "webhook": cfg.admission.port}
    env = {e["name"] for e in pod["containers"][0]["env"]}
    assert {"POD_NAME", "POD_NAMESPACE"} <= env  # the leader label and the Lease namespace


def test_deployment_is_ha_and_probes_exist() -> None:
    dep = one(DEPLOY / "allocator" / "deployment.yaml", "Deployment")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    c = pod["containers"][0]
    assert c["readinessProbe"]["httpGet"]["path"] == "/syncz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"/syncz", "/healthz", "/readyz", "/metrics"} <= set(HEALTH_PATHS)


def test_service_reaches_only_the_leader() -> None:
    svc = one(DEPLOY / "allocator" / "service.yaml", "Service", DEFAULT_SERVICE)
    assert svc["metadata"]["namespace"] == DEFAULT_NAMESPACE
    assert svc["spec"]["selector"][LEADER_LABEL] == "true"
    assert svc["spec"]["ports"][0]["port"] == allocator_config().port


def test_rbac_covers_every_call_and_nothing_more() -> None:
    rbac = DEPLOY / "allocator" / "rbac.yaml"
    rules = one(rbac, "ClusterRole")["rules"]
    grants = {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    needed = {
        ("", "nodes", "list"), ("", "nodes", "watch"),
        ("", "pods", "list"), ("", "pods", "watch"), ("", "pods", "get"), ("", "pods", "patch"),
        ("", "pods/binding", "create"),
        ("scheduling.koordinator.sh", "devices", "list"), ("scheduling.koordinator.sh", "devices", "watch"),
        ("scheduling.x-k8s.io", "podgroups", "list"), ("scheduling.x-k8s.io", "podgroups", "watch"),
        ("policy", "poddisruptionbudgets", "list"), ("policy", "poddisruptionbudgets", "watch"),
        ("events.k8s.io", "events", "create"), ("events.k8s.io", "events", "patch"),
        ("resource.k8s.io", "resourceclaims", "watch"), ("resource.k8s.io", "resourceclaims", "patch"),
        ("resource.k8s.io", "resourceclaims/status", "patch"), ("resource.k8s.io", "resourceclaims/binding", "patch"),
        ("resource.k8s.io", "resourceclaimtemplates", "watch"), ("resource.k8s.io", "deviceclasses", "watch"),
        ("resource.k8s.io", "resourceslices", "watch"),
    }  # fmt: skip
    assert needed <= grants
    assert not any(v in ("delete", "deletecollection", "update", "*") for _, _, v in grants)
    assert not any(r in ("secrets", "*") for _, r, _ in grants)
    lease_rules = one(rbac, "Role")["rules"]
    named = [r for r in lease_rules if r.get("resourceNames")]
    assert named[0]["resourceNames"] == [allocator_config().leader_election.lease_name]
    assert set(named[0]["verbs"]) == {"get", "update"}


def _extender(config: dict[str, Any]) -> dict[str, Any]:
    assert config["kind"] == "KubeSchedulerConfiguration"
    (ext,) = config["extenders"]
    return ext


def _check_extender(ext: dict[str, Any]) -> None:
    assert (ext["filterVerb"], ext["bindVerb"]) == ("filter", "bind")
    # The scheduler's prioritize call matches the allocator's round trips (docs/service.md).
    assert ext.get("prioritizeVerb") == {1: None, 2: "prioritize"}[allocator_config().round_trips]
    # The route exists (a configured preemptVerb answering 404 stops all preemption).
    assert ext["preemptVerb"] == "preempt" and "preempt" in VERBS
    assert ext["nodeCacheCapable"] is True and ext["enableHTTPS"] is True and ext["ignorable"] is False
    tls = ext["tlsConfig"]
    assert tls["insecure"] is False and {"caFile", "certFile", "keyFile"} <= set(tls)
    assert ext["httpTimeout"] == "5s" and allocator_config().bind_deadline < 5
    assert ext["weight"] >= 1
    # Every device resource of the contract is managed, so no device pod bypasses the allocator.
    assert {m["name"] for m in ext["managedResources"]} == set(rn.RESOURCE_DEVICE_TYPE)
    for m in ext["managedResources"]:
        # Only whole-card resources are advertised by kubelets' device plugins.
        assert m["ignoredByScheduler"] is (m["name"] not in rn.WHOLE_GPU_RESOURCES)


def test_self_managed_scheduler_config() -> None:
    ext = _extender(docs(DEPLOY / "kube-scheduler" / "kube-scheduler-config.yaml")[0])
    _check_extender(ext)
    # The static pod cannot resolve Service names: TLS checks the Service name instead of the IP.
    assert ext["tlsConfig"]["serverName"] in certs.service_dns_names(DEFAULT_SERVICE, DEFAULT_NAMESPACE)


def test_secondary_scheduler() -> None:
    cm = one(DEPLOY / "secondary-scheduler" / "scheduler-config.yaml", "ConfigMap")
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert [p["schedulerName"] for p in config["profiles"]] == ["topoalloc-scheduler"]
    assert config["leaderElection"]["resourceName"] == "topoalloc-scheduler"
    ext = _extender(config)
    _check_extender(ext)
    host = ext["urlPrefix"].removeprefix("https://").rsplit(":", 1)[0]
    assert host in certs.service_dns_names(DEFAULT_SERVICE, DEFAULT_NAMESPACE)
    dep = one(DEPLOY / "secondary-scheduler" / "deployment.yaml", "Deployment")
    pod = dep["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert Path(ext["tlsConfig"]["certFile"]).parent == Path(mounts["client-cert"])
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["client-cert"]["secret"]["secretName"] == "topoalloc-scheduler-client"
    assert config["leaderElection"]["resourceName"] in str(docs(DEPLOY / "secondary-scheduler" / "rbac.yaml"))


def test_cert_manager_issues_the_secrets_the_pods_mount() -> None:
    certs_yaml = DEPLOY / "components" / "cert-manager" / "certificates.yaml"
    server = one(certs_yaml, "Certificate", "topoalloc-allocator-tls")
    assert server["spec"]["secretName"] == "topoalloc-allocator-tls"
    assert server["spec"]["dnsNames"] == certs.service_dns_names(
        DEFAULT_SERVICE, DEFAULT_NAMESPACE
    ) + certs.service_dns_names(WEBHOOK_SERVICE, DEFAULT_NAMESPACE)
    assert "server auth" in server["spec"]["usages"]
    client = one(certs_yaml, "Certificate", "topoalloc-scheduler-client")
    assert client["spec"]["commonName"] == certs.SCHEDULER_CLIENT_CN
    assert f"CN={client['spec']['commonName']}" in allocator_config().allowed_clients
    assert "client auth" in client["spec"]["usages"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (for kustomize) is not installed")
@pytest.mark.parametrize("variant", ["", "secondary-scheduler", "cert-manager"])
def test_kustomizations_build(variant: str) -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY / variant)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(out) if d]
    # Device, PodGroup, Reservation
    assert kinds.count("CustomResourceDefinition") == 3 and "Deployment" in kinds
    if variant == "secondary-scheduler":
        assert kinds.count("Deployment") == 2
    if variant == "cert-manager":
        assert kinds.count("Certificate") == 3
