"""Kubernetes objects for simulated nodes and pods, in exactly the shapes the production core reads.

An openb node becomes a Node (cpu, memory and pods allocatable, the GPU-model label) and a Device
CR (one `gpu` device per GPU with `gpu-core` 100, `gpu-memory` of the model's real size and
`gpu-memory-ratio` 100; the model as the Device label). An openb pod becomes a Pod: a whole-GPU
task requests `nvidia.com/gpu: N`; a sharing task `koordinator.sh/gpu-core: P` and
`koordinator.sh/gpu-memory-ratio: P` with P = gpu_milli / 10; its `gpu_spec` becomes required node
affinity `node.koordinator.sh/gpu-model In [...]`. openb nodes carry no topology, so the core
treats their GPUs as one flat set (plain per-device selection).
"""

from __future__ import annotations

from typing import Any

from apis import keys
from apis import resources as rn
from simulator.openb import GPU_MILLI, OpenbNode, OpenbPod

#: GPU memory per openb model, in MiB. P100, T4, V100M16, V100M32 and A10 are the public sizes of
#: those boards (P100: the 16 GB variant). G1/G2/G3 are Alibaba's internal codes with no published
#: size: 32 GiB is assumed. openb pods ask for memory as a ratio, so only the `gpu-memory` value
#: written into allocations depends on these numbers.
GPU_MEMORY_MIB: dict[str, int] = {
    "P100": 16 * 1024,
    "T4": 16 * 1024,
    "V100M16": 16 * 1024,
    "V100M32": 32 * 1024,
    "A10": 24 * 1024,
    "G1": 32 * 1024,
    "G2": 32 * 1024,
    "G3": 32 * 1024,
}
UNKNOWN_MODEL_MIB = 32 * 1024
#: The FGD artifact caps pods per node at 1001, which never binds.
OPENB_MAX_PODS = 1001
NAMESPACE = "sim"


def node_object(
    name: str, cpu_milli: int, memory_mib: int, pods: int, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    allocatable = {"cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi", "pods": str(pods)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "status": {"capacity": dict(allocatable), "allocatable": allocatable},
    }


def openb_node_objects(node: OpenbNode) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The Node and (for a node with GPUs) the Device CR of an openb node."""
    labels = {keys.GPU_MODEL: node.model, keys.GPU_VENDOR: "nvidia"} if node.gpu_count else {}
    obj = node_object(node.name, node.cpu_milli, node.memory_mib, OPENB_MAX_PODS, labels)
    if not node.gpu_count:
        return obj, None
    memory = GPU_MEMORY_MIB.get(node.model, UNKNOWN_MODEL_MIB)
    devices = [
        {
            "type": "gpu",
            "id": f"GPU-{node.name}-{minor}",
            "minor": minor,
            "health": True,
            "resources": {
                rn.GPU_CORE: "100",
                rn.GPU_MEMORY: f"{memory}Mi",
                rn.GPU_MEMORY_RATIO: "100",
            },
        }
        for minor in range(node.gpu_count)
    ]
    device = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "metadata": {"name": node.name, "labels": dict(labels)},
        "spec": {"devices": devices},
    }
    return obj, device


def gpu_model_affinity(models: tuple[str, ...]) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": keys.GPU_MODEL, "operator": "In", "values": list(models)}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def pod_object(
    name: str,
    requests: dict[str, str],
    *,
    models: tuple[str, ...] = (),
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    namespace: str = NAMESPACE,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    spec: dict[str, Any] = {
        "schedulerName": "default-scheduler",
        "containers": [{"name": "main", "resources": {"requests": requests, "limits": dict(requests)}}],
    }
    if models:
        spec["affinity"] = gpu_model_affinity(models)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def openb_requests(pod: OpenbPod) -> dict[str, str]:
    requests = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    if pod.num_gpu == 0:
        return requests
    if pod.gpu_milli >= GPU_MILLI:
        requests[rn.NVIDIA_GPU] = str(pod.num_gpu)
    else:
        share = str(pod.gpu_milli // 10)
        requests[rn.GPU_CORE] = share
        requests[rn.GPU_MEMORY_RATIO] = share
    return requests


def openb_pod_object(pod: OpenbPod) -> dict[str, Any]:
    return pod_object(pod.name, openb_requests(pod), models=pod.gpu_spec)
