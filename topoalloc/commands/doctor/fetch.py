"""The thin layer that reads the cluster for doctor: one LIST or GET per kind (through the
installer's client, `installer/cluster.py`), the Events of the pods that wait too long, and the
admission probes: a server-side dry-run create of a pod each webhook selects (kube-apiserver calls
the webhooks as for a real pod; nothing is stored). A kind RBAC does not let the user read is noted
(`Facts.unreadable`) and its checks say so; a cluster that does not answer is a runtime failure."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from apis import device, dra
from apis.kinds import CONFIGMAPS, MUTATING_WEBHOOKS, NAMESPACES, PODS, SECRETS
from topoalloc.commands.doctor.facts import (
    JSON,
    NAMESPACE,
    NOT_INSTALLED,
    PLACEMENT_WEBHOOK,
    SERVER_SECRET,
    WEBHOOK_CONFIGURATION,
    Facts,
    Probe,
    SchedulerConfig,
    meta,
)
from topoalloc.commands.doctor.findings import Thresholds
from topoalloc.commands.doctor.waiting import stuck
from topoalloc.commands.installer.cluster import ApiError, Cluster
from topoalloc.commands.installer.kubeadm import CONFIG
from topoalloc.commands.installer.kustomize import KustomizeError, build
from topoalloc.commands.installer.manifests import MANAGED_BY, MANAGER, RECORD

T = TypeVar("T")
GANG_WEBHOOK = "podgroup.gang.topoalloc.io"
PROBE_PREFIX = "topoalloc-doctor-probe-"
EXCLUDED = ("kube-system", NAMESPACE)  # the webhooks' namespaceSelector leaves these out


def _read(facts: Facts, what: str, call: Callable[[], T], empty: T) -> T:
    try:
        return call()
    except ApiError as exc:
        if exc.status not in (401, 403):
            raise
        facts.unreadable[what] = str(exc)
        return empty


def wanted_crds(root: Path | None) -> dict[str, JSON]:
    if root is None:
        return {}
    try:
        docs = build(root / "deploy" / "crds")
    except KustomizeError:
        return {}
    return {str(d["metadata"]["name"]): d for d in docs if d.get("kind") == "CustomResourceDefinition"}


def gather(
    cluster: Cluster,
    root: Path | None,
    limits: Thresholds,
    *,
    probe_namespace: str | None = "default",
    scheduler_config: Path | None = None,
    kubeadm_dir: Path | None = None,
    clock: Callable[[], float] = time.time,
) -> Facts:
    local = clock()
    server = cluster.server_time()
    facts = Facts(
        now=server if server is not None else local, local_now=local, server_now=server, host=cluster.host
    )
    facts.server_version = cluster.version()
    facts.wanted_crds = wanted_crds(root)
    record = _read(facts, "record", lambda: cluster.get(CONFIGMAPS.path(RECORD, namespace=NAMESPACE)), None)
    if record is not None and (meta(record).get("labels") or {}).get(MANAGED_BY) == MANAGER:
        facts.record = record.get("data") or {}
    for name in facts.wanted_crds:
        path = cluster.path("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
        found = _read(facts, "crds", lambda p=path: cluster.get(p), None) if path else None
        if found is not None:
            facts.crds[name] = found
    by_name = lambda items: {str(meta(i).get("name")): i for i in items}  # noqa: E731
    facts.deployments = by_name(
        _read(facts, "deployments", lambda: cluster.list("apps/v1", "Deployment", namespace=NAMESPACE), [])
    )
    facts.daemonsets = _read(facts, "daemonsets", lambda: cluster.list("apps/v1", "DaemonSet"), [])
    facts.pods = _read(facts, "pods", lambda: cluster.list("v1", "Pod"), [])
    facts.nodes = _read(facts, "nodes", lambda: cluster.list("v1", "Node"), [])
    facts.devices = _read(facts, "devices", lambda: cluster.list(device.API_VERSION, device.KIND), [])
    facts.slices = _read(
        facts, "slices", lambda: cluster.list(f"{dra.GROUP}/{dra.VERSION}", "ResourceSlice"), []
    )
    facts.claims = _read(
        facts, "claims", lambda: cluster.list(f"{dra.GROUP}/{dra.VERSION}", "ResourceClaim"), []
    )
    facts.leases = by_name(
        _read(
            facts, "leases", lambda: cluster.list("coordination.k8s.io/v1", "Lease", namespace=NAMESPACE), []
        )
    )
    facts.configmaps = by_name(
        _read(facts, "configmaps", lambda: cluster.list("v1", "ConfigMap", namespace=NAMESPACE), [])
    )
    secret = _read(
        facts, "secrets", lambda: cluster.get(SECRETS.path(SERVER_SECRET, namespace=NAMESPACE)), None
    )
    facts.secrets = {SERVER_SECRET: secret} if secret is not None else {}
    facts.services = _read(facts, "services", lambda: cluster.list("v1", "Service"), [])
    facts.webhooks = _read(
        facts, "webhooks", lambda: cluster.get(MUTATING_WEBHOOKS.path(WEBHOOK_CONFIGURATION)), None
    )
    for namespace in sorted(
        {
            str(meta(p).get("namespace"))
            for p in stuck(facts.pods, facts.now, min(limits.gated_after, limits.prepare_after))
        }
    ):
        facts.events += _read(
            facts, "events", lambda ns=namespace: cluster.list("v1", "Event", namespace=ns), []
        )
    facts.scheduler_configs = scheduler_configs(facts, scheduler_config, kubeadm_dir)
    if probe_namespace is None:
        facts.probe_note = "--no-probe"
    else:
        probe_all(cluster, facts, probe_namespace)
    return facts


def scheduler_configs(facts: Facts, given: Path | None, kubeadm_dir: Path | None) -> list[SchedulerConfig]:
    """The file given, else in kubeadm mode (or with nothing installed: a leftover) the one
    `install --mode kubeadm` wrote, if it is here."""
    path = given
    if path is None and kubeadm_dir is not None and facts.mode()[0] in ("kubeadm", NOT_INSTALLED):
        path = kubeadm_dir / CONFIG
        if not path.is_file():
            return []
    if path is None:
        return []
    return [SchedulerConfig(f"file {path}", path.read_text())]


def probe_pods(facts: Facts) -> list[tuple[str, str, JSON]]:
    """(webhook, what its answer adds, the pod to dry-run) for each webhook worth asking."""
    config = facts.allocator_config()
    hooks = {h.get("name") for h in (facts.webhooks or {}).get("webhooks") or []}
    out = []
    for hook, block, gate, extra in (
        (PLACEMENT_WEBHOOK, "placement", "topoalloc.io/placement", {"limits": {"nvidia.com/gpu": "1"}}),
        (GANG_WEBHOOK, "gang", "topoalloc.io/gang", {}),
    ):
        settings = config.get(block) or {}
        if hook not in hooks or settings.get("enabled") is False:
            continue
        pod = _probe_pod(extra, (settings.get("schedulerNames") or [""])[0])
        if hook == GANG_WEBHOOK:
            pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = "topoalloc-doctor-probe"
        out.append((hook, gate, pod))
    return out


def _probe_pod(resources: JSON, scheduler: str) -> JSON:
    container: dict[str, Any] = {
        "name": "probe",
        "image": "registry.k8s.io/pause:3.10",
        "resources": resources,
        # admitted under the restricted Pod Security Standard too
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    spec: JSON = {
        "containers": [container],
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": PROBE_PREFIX, "labels": {}},
        "spec": spec,
    }


def probe_all(cluster: Cluster, facts: Facts, namespace: str) -> None:
    ns = _read(facts, "namespace", lambda: cluster.get(NAMESPACES.path(namespace)), None)
    labels = meta(ns).get("labels") or {}
    for hook, gate, pod in probe_pods(facts):
        if hook == PLACEMENT_WEBHOOK and labels.get("topoalloc.io/placement") == "false":
            facts.probe_note = f"namespace {namespace} is opted out of placement; pass --probe-namespace"
            continue
        try:
            admitted = cluster.request(
                "POST", PODS.path(namespace=namespace), body=pod, query={"dryRun": "All"}
            )
        except ApiError as exc:
            if exc.status in (401, 403):
                facts.probe_note = (
                    f"creating pods in namespace {namespace} is not allowed ({exc}); pass --probe-namespace"
                )
                return
            facts.probes.append(Probe(hook, gate, refused=exc.message))
            continue
        facts.probes.append(Probe(hook, gate, admitted=admitted))
