"""Resource names (protocol section 1.2) and which device type each belongs to."""

from __future__ import annotations

from enum import StrEnum


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

# Mid-tier (reclaimable) node resources published by the agent.
MID_CPU = "kubernetes.io/mid-cpu"  # milli-cores, integer
MID_MEMORY = "kubernetes.io/mid-memory"  # bytes

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"
