"""A cluster on the fake API server with every trace topoalloc leaves, and some that are others'
(tests/install/test_cleanup.py). No tests here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from apis import dra, keys
from tests.support.fakeapi import FakeApiServer, ResourceType
from tests.support.fakeapi.behaviour import DEFAULT_BEHAVIOUR
from tests.support.fakeapi.builtin import METADATA_ONLY_SCHEMA, field_getters

NAMESPACE = "topoalloc-system"
OURS = {"app.kubernetes.io/part-of": "topoalloc"}
REPO = Path(__file__).resolve().parents[2]

# What a kube-apiserver serves that the fake does not by default.
SERVED = (
    ("apps", "v1", "daemonsets", "DaemonSet", True),
    ("", "v1", "configmaps", "ConfigMap", True),
    ("", "v1", "services", "Service", True),
    ("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False),
    (dra.GROUP, dra.VERSION, "resourceslices", "ResourceSlice", False),
    (dra.GROUP, dra.VERSION, "deviceclasses", "DeviceClass", False),
    (dra.GROUP, dra.VERSION, "resourceclaims", "ResourceClaim", True),
)  # fmt: skip


def serve_kinds(fake: FakeApiServer) -> None:
    fake.serve(
        *(
            ResourceType(
                group=group,
                version=version,
                plural=plural,
                kind=kind,
                namespaced=namespaced,
                behaviour=DEFAULT_BEHAVIOUR,
                singular=kind.lower(),
                status_subresource=kind in ("DaemonSet", "Service", "ResourceClaim"),
                field_getters=field_getters(namespaced),
                merge_schema=METADATA_ONLY_SCHEMA,
            )
            for group, version, plural, kind, namespaced in SERVED
        )
    )


def node(name: str, labels: dict[str, str], resources: dict[str, str]) -> dict[str, Any]:
    status = {"cpu": "64", "memory": "512Gi", "pods": "110", **resources}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {"capacity": dict(status), "allocatable": dict(status)},
    }


def pod(name: str, namespace: str = "train", **spec: Any) -> dict[str, Any]:
    meta = spec.pop("metadata", {})
    status = spec.pop("status", {"phase": "Pending"})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, **meta},
        "spec": {"containers": [{"name": "c", "image": "x"}], **spec},
        "status": status,
    }


def resource_slice(name: str, node_name: str, driver: str) -> dict[str, Any]:
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


AGENT_NODE_LABELS = {
    dra.MODE_LABEL: "device-plugin",
    keys.GPU_MODEL: "H100",
    keys.GPU_VENDOR: "nvidia",
    "topoalloc.io/topology-manager-scope": "container",
    "team": "ml",  # the user's
}
AGENT_RESOURCES = {
    "nvidia.com/gpu": "8",  # kubelet's, from the device plugin: kubelet drops it itself
    "koordinator.sh/gpu": "800",
    "koordinator.sh/gpu-core": "800",
    "koordinator.sh/gpu-memory": "640Gi",
    "koordinator.sh/gpu-memory-ratio": "800",
    "koordinator.sh/rdma": "800",
}


def traces(fake: FakeApiServer) -> None:
    """gpu-a: the agent's node (marked), its agent pod still running; cpu-1: another system's
    koordinator.sh/gpu without topoalloc's mark; the slices, classes, gated pods and leftovers."""
    serve_kinds(fake)
    for ns in (NAMESPACE, "train", "kube-system"):
        fake.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    fake.put(node("gpu-a", AGENT_NODE_LABELS, AGENT_RESOURCES))
    fake.put(node("cpu-1", {keys.GPU_MODEL: "T4"}, {"koordinator.sh/gpu": "100"}))
    fake.put(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "topoalloc-gang", "labels": OURS},
            "webhooks": [],
        }
    )
    fake.put(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "someone-elses"},
            "webhooks": [],
        }
    )
    fake.put(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "topoalloc-agent", "namespace": NAMESPACE, "labels": OURS},
            "spec": {"selector": {"matchLabels": {"app": "a"}}, "template": {}},
        }
    )
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "topoalloc-agent", "uid": "ds-1"}
    fake.put(
        pod(
            "topoalloc-agent-x1",
            NAMESPACE,
            nodeName="gpu-a",
            metadata={"ownerReferences": [owner]},
            status={"phase": "Running"},
        )
    )
    fake.put(resource_slice("gpu-a-topoalloc.io-0", "gpu-a", dra.DRIVER))
    fake.put(resource_slice("gpu-a-gpu.nvidia.com-0", "gpu-a", "gpu.nvidia.com"))
    for doc in yaml.safe_load_all((REPO / "deploy" / "dra" / "deviceclasses.yaml").read_text()):
        fake.put(doc)
    fake.put(
        {
            "apiVersion": dra.API_VERSION,
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}]},
        }
    )
    fake.put(pod("placed", schedulingGates=[{"name": keys.PLACEMENT_GATE}]))
    fake.put(
        pod(
            "member",
            schedulingGates=[
                {"name": "example.com/quota"},
                {"name": keys.GANG_SCHEDULING_GATE},
                {"name": dra.SCHEDULING_GATE},
            ],
        )
    )
    fake.put(pod("quota-only", schedulingGates=[{"name": "example.com/quota"}]))
    fake.put(
        pod(
            "trainer",
            nodeName="gpu-a",
            metadata={"annotations": {keys.DEVICE_ALLOCATED: '{"gpu":[{"minor":0}]}'}},
            status={"phase": "Running"},
        )
    )
    fake.put(
        pod(
            "finished",
            nodeName="gpu-a",
            metadata={"annotations": {keys.DEVICE_ALLOCATED: '{"gpu":[{"minor":1}]}'}},
            status={"phase": "Succeeded"},
        )
    )
    claim_status = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": dra.DRIVER, "pool": "gpu-a", "device": "gpu-0"}]
            }
        }
    }
    fake.put(
        {
            "apiVersion": dra.API_VERSION,
            "kind": "ResourceClaim",
            "metadata": {"name": "pair", "namespace": "train"},
            "spec": {"devices": {"requests": []}},
            "status": claim_status,
        }
    )
    fake.put(
        {
            "apiVersion": dra.API_VERSION,
            "kind": "ResourceClaim",
            "metadata": {"name": "unallocated", "namespace": "train"},
            "spec": {"devices": {"requests": []}},
        }
    )
    for name, phase in (("held", "Available"), ("done", "Succeeded")):
        fake.put(
            {
                "apiVersion": "scheduling.koordinator.sh/v1alpha1",
                "kind": "Reservation",
                "metadata": {"name": name},
                "spec": {"template": {"spec": {"containers": []}}, "owners": [{"object": {"name": "x"}}]},
                "status": {"phase": phase},
            }
        )
