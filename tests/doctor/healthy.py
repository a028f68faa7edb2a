"""A healthy placement-mode installation as doctor reads it, built from the repository's own
manifests and fixtures (CRDs, the webhook configuration, the allocator's and agents' ConfigMaps,
the agent DaemonSet, two recorded machines' Devices) and certificates issued for the test: the
objects a cluster holds after `topoalloc install` with every pod running. Each test breaks one
thing of a fresh copy. No tests here."""

from __future__ import annotations

import base64
import copy
import functools
import time
from pathlib import Path
from typing import Any

import yaml

from topoalloc.commands.doctor.facts import Facts, Probe
from topoalloc.commands.doctor.fetch import wanted_crds
from topoalloc.commands.installer import tls
from topoalloc.commands.installer.manifests import GANG_WEBHOOKS

REPO = Path(__file__).resolve().parents[2]
# The certificates are issued now (valid a year), so the installation's clock is now too.
NOW = float(int(time.time()))
JSON = dict[str, Any]
NS = "topoalloc-system"
CLUSTER_IP = "10.96.0.10"
NODES = {
    "gpu-a": ("dgx-h100", 8, {"nvidia.com/gpu.present": "true"}),
    "gpu-b": ("a100-pcie-4x-nvlink-pairs", 4, {"topoalloc.io/gpu-node": "true"}),
}


def iso(seconds_before_now: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(NOW - seconds_before_now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro(seconds_before_now: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(NOW - seconds_before_now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _yaml(path: str) -> list[JSON]:
    return [d for d in yaml.safe_load_all((REPO / path).read_text()) if d]


def _kind(path: str, kind: str) -> JSON:
    return next(d for d in _yaml(path) if d["kind"] == kind)


@functools.cache
def _secrets() -> dict[str, dict[str, bytes]]:
    return tls.issue_secrets(NS)


def secret(files: dict[str, bytes] | None = None) -> JSON:
    files = files or _secrets()[tls.SECRETS[0]]
    return {
        "metadata": {"name": "topoalloc-allocator-tls", "namespace": NS},
        "data": {k: base64.b64encode(v).decode() for k, v in files.items()},
    }


def ready_status() -> JSON:
    return {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "c", "ready": True, "state": {"running": {"startedAt": iso(600)}}}],
    }


def pod(name: str, namespace: str, labels: JSON, node: str, owner: tuple[str, str] | None = None) -> JSON:
    meta: JSON = {
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "uid": f"uid-{name}",
        "creationTimestamp": iso(600),
    }
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True, "uid": "o"}]
    return {
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": ready_status(),
    }


def node(name: str, gpus: int, labels: JSON) -> JSON:
    amounts = (
        {"cpu": "64", "nvidia.com/gpu": str(gpus), "koordinator.sh/gpu-core": str(100 * gpus)}
        if gpus
        else {"cpu": "8"}
    )
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "topoalloc.io/device-mode": "device-plugin", **labels},
        },
        "status": {"capacity": dict(amounts), "allocatable": dict(amounts)},
    }


def device(name: str, fixture: str) -> JSON:
    doc = _kind(f"hw-fixtures/{fixture}/expected-device.yaml", "Device")
    doc["metadata"]["name"] = name
    doc["status"]["updateTime"] = iso(30)
    return doc


def crd(wanted: JSON) -> JSON:
    served = copy.deepcopy(wanted)
    served["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "topoalloc"}
    served["status"] = {
        "conditions": [{"type": "NamesAccepted", "status": "True"}, {"type": "Established", "status": "True"}]
    }
    return served


def webhooks() -> JSON:
    config = _kind("deploy/allocator/webhook.yaml", "MutatingWebhookConfiguration")
    ca = base64.b64encode(_secrets()[tls.SECRETS[0]]["ca.crt"]).decode()
    for hook in config["webhooks"]:
        hook["clientConfig"]["caBundle"] = ca
        if hook["name"] in GANG_WEBHOOKS:
            hook["failurePolicy"] = "Fail"
    return config


def probe(webhook: str, gate: str) -> Probe:
    return Probe(webhook, gate, admitted={"spec": {"schedulingGates": [{"name": gate}]}})


def service(name: str, ip: str, port: int, selector: JSON) -> JSON:
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterIP": ip, "ports": [{"port": port}], "selector": selector},
    }


def facts() -> Facts:
    """A fresh healthy installation (every object its own copy)."""
    allocator_labels = {"app.kubernetes.io/name": "topoalloc-allocator"}
    wanted = wanted_crds(REPO)
    deployment = _kind("deploy/allocator/deployment.yaml", "Deployment")
    deployment["status"] = {"readyReplicas": 2, "replicas": 2, "availableReplicas": 2, "updatedReplicas": 2}
    agents = _kind("daemonset/daemonset.yaml", "DaemonSet")
    pods = [
        pod("topoalloc-allocator-0", NS, {**allocator_labels, "topoalloc.io/leader": "true"}, "gpu-a"),
        pod("topoalloc-allocator-1", NS, allocator_labels, "gpu-b"),
    ]
    pods += [
        pod(
            f"topoalloc-agent-{n}",
            NS,
            {"app.kubernetes.io/name": "topoalloc-agent"},
            n,
            ("DaemonSet", "topoalloc-agent"),
        )
        for n in NODES
    ]
    return Facts(
        now=NOW,
        local_now=NOW + 1,
        server_now=NOW,
        host="https://cluster.test",
        server_version="v1.35.6",
        record={"mode": "placement", "version": "0.1.0", "image": "topoalloc"},
        crds={name: crd(doc) for name, doc in wanted.items()},
        wanted_crds=wanted,
        deployments={"topoalloc-allocator": deployment},
        daemonsets=[agents],
        pods=pods,
        nodes=[node(n, gpus, labels) for n, (_, gpus, labels) in NODES.items()] + [node("cpu-1", 0, {})],
        devices=[device(n, fixture) for n, (fixture, _, _) in NODES.items()],
        leases={
            "topoalloc-allocator": {
                "metadata": {"name": "topoalloc-allocator", "namespace": NS},
                "spec": {
                    "holderIdentity": "topoalloc-allocator-0",
                    "leaseDurationSeconds": 15,
                    "renewTime": micro(2),
                },
            }
        },
        configmaps={
            "topoalloc-allocator": _kind("deploy/allocator/config.yaml", "ConfigMap"),
            "topoalloc-agent": _kind("daemonset/configmap.yaml", "ConfigMap"),
        },
        secrets={"topoalloc-allocator-tls": secret()},
        services=[
            service(
                "topoalloc-allocator", CLUSTER_IP, 8443, {**allocator_labels, "topoalloc.io/leader": "true"}
            ),
            service("topoalloc-webhook", "10.96.0.11", 443, allocator_labels),
        ],
        webhooks=webhooks(),
        probes=[
            probe("placement.topoalloc.io", "topoalloc.io/placement"),
            probe("podgroup.gang.topoalloc.io", "topoalloc.io/gang"),
        ],
    )
