"""What a container is given for a GPU or an RDMA function, shared by the device plugins (their
Allocate answers) and the DRA plugin (its CDI specs): device node names under /dev and the
environment that names the devices."""

from __future__ import annotations

import re

MIB = 1 << 20

# Every GPU container also needs these (those the host has): the driver's control device and
# unified memory; nvidia-modeset only where the display driver is loaded.
GPU_CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
# The RDMA connection manager every RDMA container needs beside its function's uverbsN.
RDMA_CM = "infiniband/rdma_cm"


def gpu_node(minor: int) -> str:
    """The GPU's device node under /dev."""
    return f"nvidia{minor}"


def pcidevice_env(resource: str) -> str:
    """`koordinator.sh/rdma` -> `PCIDEVICE_KOORDINATOR_SH_RDMA`: the SR-IOV network device plugin's
    variable naming a container's PCI functions of one resource, which SR-IOV CNI and Multus read."""
    return "PCIDEVICE_" + re.sub(r"[^A-Za-z0-9]", "_", resource).upper()


def hami_limits(memories: list[int], cores: int) -> dict[str, str]:
    """HAMi-core's limits for a container's shared GPUs: `CUDA_DEVICE_MEMORY_LIMIT_<i>` for the
    i-th GPU the container sees (bytes given, MiB written with HAMi's `m` suffix) and
    `CUDA_DEVICE_SM_LIMIT` (percent of the GPU's compute, one value for the container)."""
    out = {f"CUDA_DEVICE_MEMORY_LIMIT_{i}": f"{memory // MIB}m" for i, memory in enumerate(memories)}
    out["CUDA_DEVICE_SM_LIMIT"] = str(cores)
    return out
