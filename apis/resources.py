"""Resource names (protocol section 1.2) and which device type each belongs to."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from apis.errors import CodecError
from apis.quantity import Quantity


class DeviceType(StrEnum):
    GPU = "gpu"
    RDMA = "rdma"
    FPGA = "fpga"


KOORD = "koordinator.sh/"

#: Pod phases in which a pod holds no node resources and no devices (it has run to completion).
TERMINAL_POD_PHASES = ("Succeeded", "Failed")

NVIDIA_GPU = "nvidia.com/gpu"
AMD_GPU = "amd.com/gpu"
HYGON_DCU = "dcu.com/gpu"
GPU = KOORD + "gpu"
GPU_CORE = KOORD + "gpu-core"
GPU_MEMORY = KOORD + "gpu-memory"
GPU_MEMORY_RATIO = KOORD + "gpu-memory-ratio"
GPU_SHARED = KOORD + "gpu.shared"
NPU_CORE = "huawei.com/npu-core"
NPU_CPU = "huawei.com/npu-cpu"
NPU_DVPP = "huawei.com/npu-dvpp"
RDMA = KOORD + "rdma"
FPGA = KOORD + "fpga"

# Whole cards counted as integers.
WHOLE_GPU_RESOURCES = (NVIDIA_GPU, AMD_GPU, HYGON_DCU)

RESOURCE_DEVICE_TYPE: dict[str, DeviceType] = {
    NVIDIA_GPU: DeviceType.GPU,
    AMD_GPU: DeviceType.GPU,
    HYGON_DCU: DeviceType.GPU,
    GPU: DeviceType.GPU,
    GPU_CORE: DeviceType.GPU,
    GPU_MEMORY: DeviceType.GPU,
    GPU_MEMORY_RATIO: DeviceType.GPU,
    GPU_SHARED: DeviceType.GPU,
    NPU_CORE: DeviceType.GPU,
    NPU_CPU: DeviceType.GPU,
    NPU_DVPP: DeviceType.GPU,
    RDMA: DeviceType.RDMA,
    FPGA: DeviceType.FPGA,
}


def _whole(value: Any) -> int:
    """An amount as a count (0 for one that is absent, negative or not a quantity)."""
    if value is None:
        return 0
    try:
        return max(0, Quantity.parse(value).value())
    except CodecError:
        return 0


def node_gpus(amounts: Mapping[str, Any]) -> int:
    """How many whole GPUs a Node's allocatable (or capacity) names: the one count every reader
    uses (`topoalloc topology`, gang minResources, the installer).

    The vendor's device plugin announces the cards (`nvidia.com/gpu: 8`) and topoalloc's agent the
    same cards again in hundreds (`koordinator.sh/gpu: 800`): on a node with both they are one set
    of GPUs, so the count is the larger of the two, never their sum. Values are quantities (strings
    or the whole numbers a parsed Node holds)."""
    vendor = sum(_whole(amounts.get(name)) for name in WHOLE_GPU_RESOURCES)
    return max(vendor, _whole(amounts.get(GPU)) // 100)


def pod_gpus(requests: Mapping[str, Any]) -> int:
    """How many GPUs a container's requests take, a share of one counting as one (the GPUs
    `topoalloc topology` counts as used)."""
    vendor = sum(_whole(requests.get(name)) for name in WHOLE_GPU_RESOURCES)
    count = max(vendor, -(-_whole(requests.get(GPU)) // 100))
    if not count and (_whole(requests.get(GPU_CORE)) or _whole(requests.get(GPU_SHARED))):
        count = max(1, _whole(requests.get(GPU_SHARED)))
    return count


# Mid-tier (reclaimable) node resources published by the agent.
MID_CPU = "kubernetes.io/mid-cpu"  # milli-cores, integer
MID_MEMORY = "kubernetes.io/mid-memory"  # bytes

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"
