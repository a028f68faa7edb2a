"""What the device plugins advertise, derived from the Device CR the agent builds each pass.

Resources and their kubelet device IDs (each ID is at most 63 characters, as v1beta1 requires):

* `nvidia.com/gpu` — one ID per GPU: its UUID.
* `koordinator.sh/gpu-core` — 100 IDs per GPU, `<uuid>-u00` .. `<uuid>-u99`: one ID is one percent
  of the GPU's compute, the unit Koordinator counts `gpu-core` in (a whole GPU is 100).
* `koordinator.sh/gpu` — the same 100 IDs per GPU: Koordinator's own GPU resource (`koordinator.sh/gpu:
  100` is one whole GPU, `50` half of one: compute and memory alike), which its users write most.
* `koordinator.sh/rdma` — 100 IDs per RDMA physical function, `<pf address>-u00` .. `-u99`, the
  unit of Koordinator's `koordinator.sh/rdma` (100 = one whole NIC). Which VF the container gets is
  the allocator's choice in the pod annotation, not the ID (see admission.py).

Pure: Device in, plain data out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from apis import resources as rn
from apis.device import Device, DeviceInfo
from apis.interconnect import GpuPlace, Interconnect, build_interconnect, nvlink_gbps

UNITS = 100  # share IDs per GPU (gpu-core) and per RDMA function (rdma)
UNIT_SEP = "-u"
SERVED_RESOURCES = (rn.NVIDIA_GPU, rn.GPU_CORE, rn.GPU, rn.RDMA)
# GPUs in percent of one (100 IDs per GPU): three kubelet resources, one set of GPUs
GPU_SHARE_RESOURCES = (rn.GPU_CORE, rn.GPU)
GPU_RESOURCES = (rn.NVIDIA_GPU, *GPU_SHARE_RESOURCES)
UNIT_RESOURCES = (*GPU_SHARE_RESOURCES, rn.RDMA)


@dataclass(frozen=True)
class Place:
    """Where a device sits, for choosing devices on the node (node_choice.py); "" / -1: unknown."""

    socket: int = -1
    pcie_root: str = ""  # the root bus (`pcieID`)
    pcie_switch: str = ""  # the outermost PCIe switch (`pcieSwitchID`)
    labels: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def pcie_scope(self) -> str:
        """The tightest known PCIe scope: the switch when known, else the root bus."""
        return self.pcie_switch or self.pcie_root


@dataclass(frozen=True)
class GpuDev:
    minor: int
    uuid: str
    numa: int
    healthy: bool
    memory: int  # bytes
    place: Place = field(default_factory=Place)
    nvlinks: tuple[tuple[int, int], ...] = ()  # (peer minor, live links)


@dataclass(frozen=True)
class VfGroup:
    labels: dict[str, str] = field(compare=False)
    vfs: tuple[str, ...]  # bus IDs


@dataclass(frozen=True)
class NicDev:
    minor: int
    pf: str  # PCI address of the physical function (the Device CR's `id`)
    numa: int
    healthy: bool
    vfs: tuple[str, ...] = ()
    place: Place = field(default_factory=Place)
    vf_groups: tuple[VfGroup, ...] = ()


@dataclass(frozen=True)
class PluginDevice:
    id: str
    healthy: bool
    numa: int  # -1: unknown (no topology sent to kubelet)


@dataclass
class Inventory:
    gpus: list[GpuDev] = field(default_factory=list)
    nics: list[NicDev] = field(default_factory=list)
    gpu_model: str = ""

    @cached_property
    def interconnect(self) -> Interconnect:
        """How well each GPU pair talks (apis/interconnect.py), the matrix the allocator uses."""
        places = [
            GpuPlace(
                minor=g.minor,
                numa=g.numa,
                socket=g.place.socket,
                pcie_root=g.place.pcie_root,
                pcie_switch=g.place.pcie_switch,
                nvlinks=dict(g.nvlinks),
            )
            for g in self.gpus
        ]
        return build_interconnect(places, nvlink_gbps(self.gpu_model))

    def gpu_by_minor(self, minor: int) -> GpuDev | None:
        return next((g for g in self.gpus if g.minor == minor), None)

    def gpu_by_uuid(self, uuid: str) -> GpuDev | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def nic_by_minor(self, minor: int) -> NicDev | None:
        return next((n for n in self.nics if n.minor == minor), None)

    def devices(self, resource: str) -> list[PluginDevice]:
        """The list ListAndWatch sends for `resource`."""
        if resource == rn.NVIDIA_GPU:
            return [PluginDevice(g.uuid, g.healthy, g.numa) for g in self.gpus]
        if resource in GPU_SHARE_RESOURCES:
            return [
                PluginDevice(unit_id(g.uuid, k), g.healthy, g.numa) for g in self.gpus for k in range(UNITS)
            ]
        if resource == rn.RDMA:
            return [
                PluginDevice(unit_id(n.pf, k), n.healthy, n.numa) for n in self.nics for k in range(UNITS)
            ]
        raise ValueError(f"resource {resource} is not served by the device plugin")


def unit_id(base: str, k: int) -> str:
    return f"{base}{UNIT_SEP}{k:02d}"


def base_of(resource: str, device_id: str) -> str:
    """The GPU UUID or PF address a kubelet device ID stands for."""
    if resource in UNIT_RESOURCES:
        base, sep, k = device_id.rpartition(UNIT_SEP)
        return base if sep and k.isdigit() else ""
    return device_id


def _place(dev: DeviceInfo) -> Place:
    topo = dev.topology
    if topo is None:
        return Place(labels=dict(dev.labels))
    return Place(topo.socket_id, topo.pcie_id, topo.pcie_switch_id, dict(dev.labels))


def inventory_from_device(device: Device) -> Inventory:
    inv = Inventory(gpu_model=device.gpu_model)
    for dev in device.devices:
        numa = dev.topology.node_id if dev.topology is not None else -1
        if dev.type == rn.DeviceType.GPU and dev.id and dev.minor >= 0:
            memory = dev.resources.get(rn.GPU_MEMORY)
            links = tuple((p.minor, p.links) for p in dev.nvlink.peers) if dev.nvlink is not None else ()
            inv.gpus.append(
                GpuDev(
                    dev.minor,
                    dev.id,
                    numa,
                    dev.health,
                    memory.value() if memory is not None else 0,
                    _place(dev),
                    links,
                )
            )
        elif dev.type == rn.DeviceType.RDMA and dev.id:
            vfs = tuple(vf.bus_id for group in dev.vf_groups for vf in group.vfs if vf.bus_id)
            groups = tuple(
                VfGroup(dict(g.labels), tuple(vf.bus_id for vf in g.vfs if vf.bus_id)) for g in dev.vf_groups
            )
            inv.nics.append(NicDev(dev.minor, dev.id, numa, dev.health, vfs, _place(dev), groups))
    inv.gpus.sort(key=lambda g: g.minor)
    inv.nics.sort(key=lambda n: n.minor)
    return inv
