"""Small object builders for the fake API server's tests."""

from __future__ import annotations

from typing import Any

JsonObj = dict[str, Any]

# (group, version, plural) as the cluster-scoped custom-object calls take them.
DEVICES = ("scheduling.koordinator.sh", "v1alpha1", "devices")


def pod(
    name: str,
    namespace: str = "default",
    *,
    labels: dict[str, str] | None = None,
    gates: list[str] | None = None,
    node: str | None = None,
    **spec: Any,
) -> JsonObj:
    body: JsonObj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/cuda:12"}], **spec},
    }
    if gates:
        body["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    if node:
        body["spec"]["nodeName"] = node
    return body


def node(name: str, **labels: str) -> JsonObj:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def device(name: str, gpus: int = 2) -> JsonObj:
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": name},
        "spec": {
            "devices": [{"type": "gpu", "id": f"GPU-{i}", "minor": i, "health": True} for i in range(gpus)]
        },
    }


def podgroup(name: str, namespace: str = "default", min_member: int = 2) -> JsonObj:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minMember": min_member},
    }


def lease(name: str, holder: str, namespace: str = "default") -> JsonObj:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }
