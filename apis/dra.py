"""topoalloc as a DRA driver (resource.k8s.io/v1): the names both halves agree on.

One driver, `topoalloc.io`, publishes a node's GPUs, RDMA NICs (PFs) and their SR-IOV VFs in one
pool named after the node. Because GPUs and NICs come from the same driver, the attributes they
share (`pcieSwitch`, `socket`, and the standard `resource.kubernetes.io/pcieRoot` and `numaNode`)
have one fully-qualified name for both kinds, so a claim's `matchAttribute` aligns a GPU with its
NIC. Device names are DNS labels that encode the device: `gpu-<minor>`, `rdma-<minor>`,
`rdma-<minor>-vf-<vf>`, so the allocator maps a slice's device back to the node's Device CR
(its topology source) without reading the slice. `<vf>` is the VF's index among its NIC's VFs as
the Device CR lists them (`nic_vfs`): koordlet and topoalloc's agent both write VF minors as -1.

Attribute names without a domain belong to the driver's domain (`topoalloc.io/<name>` in a
`matchAttribute`, `device.attributes["topoalloc.io"].<name>` in CEL).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Final

from apis.device import Device, DeviceInfo
from apis.quantity import Quantity
from apis.resources import DeviceType

GROUP: Final = "resource.k8s.io"
VERSION: Final = "v1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

DRIVER: Final = "topoalloc.io"

# DeviceClasses shipped in deploy/dra/: one per kind of device a claim asks for.
GPU_CLASS: Final = "gpu.topoalloc.io"
RDMA_CLASS: Final = "rdma.topoalloc.io"  # a whole NIC (its PF)
RDMA_VF_CLASS: Final = "rdma-vf.topoalloc.io"  # one SR-IOV virtual function
CLASSES: Final = (GPU_CLASS, RDMA_CLASS, RDMA_VF_CLASS)

# Values of the `type` attribute.
TYPE_GPU: Final = "gpu"
TYPE_RDMA: Final = "rdma"
TYPE_RDMA_VF: Final = "rdma-vf"
CLASS_TYPE: Final = {GPU_CLASS: TYPE_GPU, RDMA_CLASS: TYPE_RDMA, RDMA_VF_CLASS: TYPE_RDMA_VF}

# Standard attribute names (KEP-4381, KEP-6072): shared with every other driver.
STANDARD: Final = "resource.kubernetes.io/"
PCIE_ROOT: Final = STANDARD + "pcieRoot"
PCI_BUS_ID: Final = STANDARD + "pciBusID"
NUMA_NODE: Final = STANDARD + "numaNode"

# topoalloc's attributes (the driver's domain).
ATTR_TYPE: Final = "type"
ATTR_UUID: Final = "uuid"
ATTR_PRODUCT: Final = "productName"
ATTR_MINOR: Final = "minor"
ATTR_NVLINK_DOMAIN: Final = "nvlinkDomain"
ATTR_PCIE_SWITCH: Final = "pcieSwitch"
ATTR_SOCKET: Final = "socket"
ATTR_PF: Final = "pf"  # on a VF: the name of its NIC's device
# On NICs (PFs), from the Device CR's labels, for CEL selectors (e.g. InfiniBand only).
ATTR_IBDEV: Final = "ibdev"
ATTR_NETDEV: Final = "netdev"
ATTR_LINK_LAYER: Final = "linkLayer"
ATTR_SPEED_GBPS: Final = "speedGbps"
CAPACITY_MEMORY: Final = "memory"  # bytes

# Shared GPUs (consumable capacity, beta and on from 1.36). A sharable GPU is published with
# `allowMultipleAllocations` and both capacities carrying a requestPolicy whose defaults are the
# whole GPU: a claim that asks no capacity takes all of it, one that asks `cores` shares compute.
CAPACITY_CORES: Final = "cores"  # percent of the GPU's compute (Koordinator's gpu-core)
GPU_CORES: Final = 100  # the cores of one whole GPU
SHARE_MIN_MEMORY: Final = "1Mi"  # the smallest memory a share may ask
# Whether a node's GPUs are sharable is what its slices say, as the API server stored them: a GPU
# with `allowMultipleAllocations: true` is; one without is published whole only (the agent writes
# it only where the server keeps it, and a 1.35 server, gate off, drops it on write).
ALLOW_MULTIPLE: Final = "allowMultipleAllocations"


# A GPU's partition of N GPUs in the node's partition table, named for how its GPUs reach each
# other: `nvlinkPartition<N>` only when every one of them is NVLink (the table's gpuLinkType, and one
# NVLink domain in the Device), `pciePartition<N>` otherwise. An attribute named NVLink means NVLink.
PARTITION_PREFIX: Final = "nvlinkPartition"
PCIE_PARTITION_PREFIX: Final = "pciePartition"
PARTITION_PREFIXES: Final = (PARTITION_PREFIX, PCIE_PARTITION_PREFIX)


def partition_attribute(size: int, *, nvlink: bool = True) -> str:
    """`nvlinkPartition4`: on a GPU, the id of the NVLink partition of `size` GPUs it belongs to in
    the node's partition table, so `matchAttribute: topoalloc.io/nvlinkPartition4` keeps a 4-GPU
    claim inside one NVLink partition; `pciePartition4` (nvlink=False) for a partition whose GPUs
    are not all NVLink-connected."""
    return f"{PARTITION_PREFIX if nvlink else PCIE_PARTITION_PREFIX}{size}"


def partition_of(attribute: str) -> tuple[int, bool] | None:
    """(size, nvlink) of a partition attribute (its bare or qualified name); None for any other."""
    name = attribute.removeprefix(f"{DRIVER}/")
    for prefix in PARTITION_PREFIXES:
        rest = name.removeprefix(prefix)
        if rest != name and rest.isdigit() and not rest.startswith("0"):
            return int(rest), prefix == PARTITION_PREFIX
    return None


def qualified(name: str) -> str:
    """The fully-qualified name of one of the driver's attributes (as `matchAttribute` takes it)."""
    return name if "/" in name else f"{DRIVER}/{name}"


# Node label: which device path a node is in. One node is in one mode; the allocator serves both.
MODE_LABEL: Final = "topoalloc.io/device-mode"
MODE_DEVICE_PLUGIN: Final = "device-plugin"
MODE_DRA: Final = "dra"
MODES: Final = (MODE_DEVICE_PLUGIN, MODE_DRA)

# The scheduling gate put on a pod whose claims topoalloc allocates (removed once they are).
SCHEDULING_GATE: Final = "topoalloc.io/dra"
# On a ResourceClaim or a ResourceClaimTemplate's spec.metadata: "kube-scheduler" leaves the claim
# to kube-scheduler's own (first-fit) allocation.
ALLOCATOR_ANNOTATION: Final = "topoalloc.io/allocator"
ALLOCATOR_KUBE_SCHEDULER: Final = "kube-scheduler"
# On a claim topoalloc allocates, with the value ALLOCATED_BY (set at its creation by the admission
# webhook, or written before the allocation): which claims topoalloc may move or release, also
# after a restart.
ALLOCATED_BY_ANNOTATION: Final = "topoalloc.io/allocated-by"
ALLOCATED_BY: Final = "topoalloc"
# On a claim the allocator makes in its own namespace to hold one device in kube-scheduler's count
# ("<pool>/<device>"): kube-scheduler keeps a set of allocated devices, so when one of two claims
# that shared a device lets it go, it counts the device free while the other still holds it; this
# claim, allocated after that, counts it again (allocator/claims/race.py). No pod uses it.
ANNOUNCES_ANNOTATION: Final = "topoalloc.io/announces"

# API limits (resource.k8s.io/v1 validation).
MAX_DEVICES_PER_SLICE: Final = 128
MAX_ATTRIBUTES_PER_DEVICE: Final = 32  # attributes and capacities together
MAX_REQUESTS_PER_CLAIM: Final = 32


@dataclass(frozen=True, slots=True)
class DeviceName:
    """What a slice device's name says: the device type, the minor in the Device CR, and for a VF
    its own minor."""

    type: str  # TYPE_GPU, TYPE_RDMA or TYPE_RDMA_VF
    minor: int
    vf: int | None = None

    def __str__(self) -> str:
        if self.type == TYPE_GPU:
            return f"gpu-{self.minor}"
        if self.type == TYPE_RDMA:
            return f"rdma-{self.minor}"
        return f"rdma-{self.minor}-vf-{self.vf}"

    @property
    def device_type(self) -> DeviceType:
        return DeviceType.GPU if self.type == TYPE_GPU else DeviceType.RDMA


_NAME = re.compile(r"(gpu|rdma)-(\d+)(?:-vf-(\d+))?")


@functools.lru_cache(maxsize=8192)  # a few dozen names, read for every node on every placement
def parse_device_name(name: str) -> DeviceName | None:
    """The device a topoalloc slice device name stands for (None: not one of ours)."""
    m = _NAME.fullmatch(name)
    if m is None or (m.group(1) == "gpu" and m.group(3) is not None):
        return None
    if m.group(1) == "gpu":
        return DeviceName(TYPE_GPU, int(m.group(2)))
    if m.group(3) is None:
        return DeviceName(TYPE_RDMA, int(m.group(2)))
    return DeviceName(TYPE_RDMA_VF, int(m.group(2)), int(m.group(3)))


def nic_vfs(nic: DeviceInfo) -> list[str]:
    """A NIC's VF addresses in the order its Device CR lists them (groups, then their VFs): the
    `<vf>` of a device name `rdma-<minor>-vf-<vf>` indexes this list."""
    return [vf.bus_id for group in nic.vf_groups for vf in group.vfs]


def find_device(device: Device, name: DeviceName) -> tuple[DeviceInfo, str | None] | None:
    """The Device CR entry a slice device name stands for, with the VF's address for a VF; None
    when the node has no such device (or the NIC no such VF)."""
    info = next((d for d in device.devices if d.type == name.device_type and d.minor == name.minor), None)
    if info is None:
        return None
    if name.type != TYPE_RDMA_VF:
        return info, None
    vfs = nic_vfs(info)
    if name.vf is None or not 0 <= name.vf < len(vfs) or not vfs[name.vf]:
        return None
    return info, vfs[name.vf]


def gpu_capacity(memory: str | None, *, sharable: bool) -> dict[str, Any]:
    """A GPU's `capacity` map in its slice: `memory` (a quantity) alone for a whole GPU; for a
    sharable one `memory` and `cores`, each with a requestPolicy whose default is the whole."""
    if not sharable:
        return {} if memory is None else {CAPACITY_MEMORY: {"value": memory}}
    out: dict[str, Any] = {}
    if memory is not None:
        out[CAPACITY_MEMORY] = {
            "value": memory,
            "requestPolicy": {"default": memory, "validRange": {"min": SHARE_MIN_MEMORY}},
        }
    whole = str(GPU_CORES)
    out[CAPACITY_CORES] = {
        "value": whole,
        "requestPolicy": {"default": whole, "validRange": {"min": "1", "max": whole, "step": "1"}},
    }
    return out


def share_id(result: dict[str, Any]) -> str:
    """A raw allocation result's `shareID` ("" when it has none: a whole allocation)."""
    value = result.get("shareID")
    return value if isinstance(value, str) else ""


def consumed_capacity(result: dict[str, Any]) -> dict[str, int] | None:
    """A raw allocation result's `consumedCapacity` by unqualified name (`memory` in bytes, `cores`
    in percent), rounded up to whole units; None when the result carries none (it counts as the
    whole device). Raises ValueError for a value that is not a quantity."""
    raw = result.get("consumedCapacity")
    if not isinstance(raw, dict):
        return None
    return {
        str(name).removeprefix(f"{DRIVER}/"): Quantity.parse(value, f"consumedCapacity.{name}").value()
        for name, value in raw.items()
    }
