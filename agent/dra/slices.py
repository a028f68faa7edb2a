"""The node's DRA pool from the Device CR the agent built this pass: one device per healthy GPU, RDMA
NIC (its PF) and SR-IOV VF, with their attributes, split into ResourceSlices of at most 128 devices.

Attributes come from the Device, the allocator's own topology source, so both halves read the same
facts. The ones a claim aligns devices by (`pcieSwitch`, `socket`, the standard `pcieRoot` and
`numaNode`) carry the same value on a GPU and on the NIC and VFs behind the same switch; a VF has
its PF's place in the PCIe tree. `pcieSwitch` is the Device's pcieSwitchID, else the root bus, so it
is never empty where the topology is known. `nvlinkPartition<N>` is the index of the GPU's partition
of N GPUs in the node's partition table when that partition is NVLink (its gpuLinkType says NVLink,
or says nothing, and its GPUs share one NVLink domain in the Device); a partition that is not (a
PCIe ring, an L40S pair) is `pciePartition<N>`, so a claim matching on an NVLink attribute never
gets GPUs that reach each other over PCIe only. A GPU in no partition of that size has neither.

A GPU is published sharable (consumable capacity): `allowMultipleAllocations` and the capacities
`memory` and `cores` with a requestPolicy whose defaults are the whole GPU (apis/dra.gpu_capacity);
`whole` turns the pool into whole GPUs for an API server that does not keep those fields (1.35).
NICs and VFs are always whole.

An unhealthy device (and the VFs of an unhealthy NIC) is left out, or, given a taint effect, kept
with the taint `topoalloc.io/unhealthy=<reason>` of that effect (the publisher keeps taints only
where the API server serves them: beta and on from 1.36, dropped on write before). A slice holding
a tainted device holds at most 64 devices (the API's limit for slices using taints). At most
`max_vfs` VFs per NIC are published (the first ones in Device order).

Pure: Device in, plain dicts out.
"""

from __future__ import annotations

import logging
from typing import Any

from apis import dra, keys
from apis.device import Device, DeviceInfo
from apis.dra_taints import UNHEALTHY_KEY, DeviceTaint, taint_value
from apis.partitions import GPUPartition, parse_gpu_partitions
from apis.resources import GPU_MEMORY, DeviceType

log = logging.getLogger(__name__)

DEFAULT_MAX_VFS_PER_NIC = 8
SLICE_KIND = "ResourceSlice"
MAX_DEVICES_WITH_TAINTS = 64


def _string(value: str) -> dict[str, Any]:
    return {"string": value}


def _int(value: int) -> dict[str, Any]:
    return {"int": value}


def partition_ids(device: Device) -> dict[int, dict[int, tuple[int, bool]]]:
    """minor -> {size: (index of its partition of that size, whether that partition is NVLink)}
    from the Device's partition table; {} when the Device has none or it cannot be read."""
    raw = device.annotations.get(keys.GPU_PARTITIONS)
    if not raw:
        return {}
    try:
        table = parse_gpu_partitions(raw)
    except ValueError as exc:
        log.warning("partition table of %s unreadable, no partition attributes: %s", device.name, exc)
        return {}
    domains = {
        d.minor: d.nvlink.domain if d.nvlink is not None else ""
        for d in device.devices
        if d.type == DeviceType.GPU
    }
    out: dict[int, dict[int, tuple[int, bool]]] = {}
    for size, parts in sorted(table.by_size.items()):
        for index, part in enumerate(parts):
            nvlink = _nvlink(part, domains)
            for minor in part.minors:
                out.setdefault(minor, {}).setdefault(size, (index, nvlink))
    return out


def _nvlink(part: GPUPartition, domains: dict[int, str]) -> bool:
    """Whether every GPU of the partition reaches the others over NVLink: the table does not say
    PCIe, and the Device puts them all in one NVLink domain (a table written by hand may say
    nothing, or claim NVLink for cards that have none)."""
    if part.gpu_link_type not in ("", "NVLink"):
        return False
    found = {domains.get(m, "") for m in part.minors}
    return len(found) == 1 and "" not in found


def _place(info: DeviceInfo, bus_id: str) -> dict[str, Any]:
    """The attributes of a device's place in the machine, shared by GPUs, NICs and VFs."""
    attrs: dict[str, Any] = {}
    topo = info.topology
    if bus_id:
        attrs[dra.PCI_BUS_ID] = _string(bus_id)
    if topo is None:
        return attrs
    if topo.pcie_id:
        attrs[dra.PCIE_ROOT] = _string(topo.pcie_id)
    if topo.pcie_scope:
        attrs[dra.ATTR_PCIE_SWITCH] = _string(topo.pcie_scope)
    if topo.node_id >= 0:
        attrs[dra.NUMA_NODE] = _int(topo.node_id)
    if topo.socket_id >= 0:
        attrs[dra.ATTR_SOCKET] = _int(topo.socket_id)
    return attrs


def _gpu(info: DeviceInfo, product: str, partitions: dict[int, tuple[int, bool]]) -> dict[str, Any]:
    attrs: dict[str, Any] = {dra.ATTR_TYPE: _string(dra.TYPE_GPU), dra.ATTR_MINOR: _int(info.minor)}
    if info.id:
        attrs[dra.ATTR_UUID] = _string(info.id)
    if product:
        attrs[dra.ATTR_PRODUCT] = _string(product[:64])
    if info.nvlink is not None and info.nvlink.domain:
        attrs[dra.ATTR_NVLINK_DOMAIN] = _string(info.nvlink.domain)
    for size, (index, nvlink) in sorted(partitions.items()):
        attrs[dra.partition_attribute(size, nvlink=nvlink)] = _int(index)
    attrs.update(_place(info, info.topology.bus_id if info.topology else ""))
    out: dict[str, Any] = {"name": str(dra.DeviceName(dra.TYPE_GPU, info.minor)), "attributes": attrs}
    memory = info.resources.get(GPU_MEMORY)
    out[dra.ALLOW_MULTIPLE] = True
    out["capacity"] = dra.gpu_capacity(None if memory is None else str(memory), sharable=True)
    return out


def _nic(info: DeviceInfo) -> dict[str, Any]:
    attrs: dict[str, Any] = {dra.ATTR_TYPE: _string(dra.TYPE_RDMA), dra.ATTR_MINOR: _int(info.minor)}
    for attr, label in (
        (dra.ATTR_IBDEV, "ibdev"),
        (dra.ATTR_NETDEV, "netdev"),
        (dra.ATTR_LINK_LAYER, "linkLayer"),
    ):
        if info.labels.get(label):
            attrs[attr] = _string(info.labels[label][:64])
    speed = info.labels.get("speedGbps", "")
    if speed.isdigit():
        attrs[dra.ATTR_SPEED_GBPS] = _int(int(speed))
    attrs.update(_place(info, info.id))
    return {"name": str(dra.DeviceName(dra.TYPE_RDMA, info.minor)), "attributes": attrs}


def _vfs(info: DeviceInfo, max_vfs: int) -> list[dict[str, Any]]:
    pf = str(dra.DeviceName(dra.TYPE_RDMA, info.minor))
    out = []
    for index, bus_id in enumerate(dra.nic_vfs(info)[:max_vfs]):
        if not bus_id:
            continue
        attrs: dict[str, Any] = {
            dra.ATTR_TYPE: _string(dra.TYPE_RDMA_VF),
            dra.ATTR_MINOR: _int(info.minor),
            dra.ATTR_PF: _string(pf),
        }
        attrs.update(_place(info, bus_id))  # its own address, its PF's place: VFs sit on the PF's bus
        name = dra.DeviceName(dra.TYPE_RDMA_VF, info.minor, index)
        out.append({"name": str(name), "attributes": attrs})
    return out


def _size(partition_attribute: str) -> int:
    found = dra.partition_of(partition_attribute)
    return 0 if found is None else found[0]


def _within_limit(dev: dict[str, Any]) -> dict[str, Any]:
    """Trim a device to the API's 32 attributes and capacities, dropping the largest partition
    sizes first (a node with that many sizes is far beyond any machine known today)."""
    attrs, capacity = dev["attributes"], dev.get("capacity", {})
    extra = len(attrs) + len(capacity) - dra.MAX_ATTRIBUTES_PER_DEVICE
    if extra > 0:
        sizes = sorted((k for k in attrs if dra.partition_of(k) is not None), key=_size, reverse=True)
        for key in sizes[:extra]:
            del attrs[key]
        log.warning("device %s: %d attributes over the API's limit left out", dev["name"], extra)
    return dev


def unhealthy_taint(info: DeviceInfo, effect: str) -> DeviceTaint:
    """The taint of an unhealthy device: its health condition's reason, since its transition."""
    cond = info.conditions[0] if info.conditions else None
    reason = taint_value(cond.reason if cond is not None else "") or "Unhealthy"
    return DeviceTaint(UNHEALTHY_KEY, effect, reason, cond.last_transition_time if cond is not None else "")


def _tainted(devs: list[dict[str, Any]], info: DeviceInfo, effect: str | None) -> list[dict[str, Any]]:
    if not info.health:
        assert effect is not None
        taint = unhealthy_taint(info, effect).to_dict()
        for dev in devs:
            dev["taints"] = [dict(taint)]
    return devs


def pool_devices(
    device: Device, *, products: dict[int, str] | None = None, max_vfs: int, taint_effect: str | None = None
) -> list[dict[str, Any]]:
    """The pool's devices, in a stable order: GPUs by minor, then each NIC followed by its VFs.
    Unhealthy ones are left out, or tainted with `taint_effect` when given."""
    products = products or {}
    partitions = partition_ids(device)

    def kept(dtype: str) -> list[DeviceInfo]:
        found = (d for d in device.devices if d.type == dtype and (d.health or taint_effect))
        return sorted(found, key=lambda d: d.minor)

    out = []
    for g in kept(DeviceType.GPU):
        gpu = _gpu(g, products.get(g.minor, ""), partitions.get(g.minor, {}))
        out.extend(_tainted([gpu], g, taint_effect))
    for nic in kept(DeviceType.RDMA):
        out.extend(_tainted([_nic(nic), *_vfs(nic, max_vfs)], nic, taint_effect))
    return [_within_limit(dev) for dev in out]


def untainted(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pool where the API server drops device taints: the devices tainted unhealthy left out."""
    return [d for d in devices if not any(t.get("key") == UNHEALTHY_KEY for t in d.get("taints") or ())]


def whole(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pool where the API server drops consumable capacity: every GPU whole, its `memory`
    capacity without a requestPolicy and no `cores`."""
    out = []
    for dev in devices:
        if dev.get(dra.ALLOW_MULTIPLE):
            dev = {k: v for k, v in dev.items() if k != dra.ALLOW_MULTIPLE}
            memory = (dev.get("capacity") or {}).get(dra.CAPACITY_MEMORY)
            dev["capacity"] = dra.gpu_capacity(None if memory is None else memory["value"], sharable=False)
            if not dev["capacity"]:
                del dev["capacity"]
        out.append(dev)
    return out


def slice_name(node: str, index: int) -> str:
    """`<node>-topoalloc.io-<index>`, a DNS subdomain (the node name is cut when it is too long)."""
    suffix = f"-{dra.DRIVER}-{index}"
    return node[: 253 - len(suffix)].rstrip(".-") + suffix


def pool_slices(
    node: str, devices: list[dict[str, Any]], generation: int, *, node_uid: str = ""
) -> list[dict[str, Any]]:
    """The ResourceSlices of the node's pool: at most 128 devices each, every one naming the same
    generation and the pool's slice count, owned by the Node (when its UID is known) so that they go
    with it. A node without devices still has one (empty) slice, so the pool says "nothing here"
    rather than disappearing."""
    metadata: dict[str, Any] = {}
    if node_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        ]
    per = MAX_DEVICES_WITH_TAINTS if any(d.get("taints") for d in devices) else dra.MAX_DEVICES_PER_SLICE
    chunks = [devices[i : i + per] for i in range(0, len(devices), per)] or [[]]
    return [
        {
            "apiVersion": dra.API_VERSION,
            "kind": SLICE_KIND,
            "metadata": {"name": slice_name(node, i), **metadata},
            "spec": {
                "driver": dra.DRIVER,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": len(chunks)},
                "nodeName": node,
                "devices": chunk,
            },
        }
        for i, chunk in enumerate(chunks)
    ]
