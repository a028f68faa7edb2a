"""What a DRA-mode node publishes (its pool's devices, from its ResourceSlices) and how those names
map to the Device CR the core reads: `gpu-<minor>`, `rdma-<minor>`, `rdma-<minor>-vf-<index>`
(`index` into the NIC's VFs in Device order, apis/dra.py). And the other way: what a claim's results
take on the node, as the `device-allocated` entries the core counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from allocator.core.devices.gpu import GPUHandler
from allocator.core.node.inventory import VF, DeviceSlot, NodeInventory
from allocator.core.request.cel import PublishedDevice
from apis import dra
from apis import resources as rn
from apis.annotations import AllocatedVF, DeviceAllocation, DeviceAllocations
from apis.dra_claims import DeviceResult
from apis.dra_slices import ResourceSlice
from apis.quantity import Format, Quantity

GPU, RDMA = rn.DeviceType.GPU, rn.DeviceType.RDMA


@dataclass(frozen=True)
class NodeDevices:
    """A node's pool of topoalloc.io devices as its slices publish them."""

    pool: str
    devices: Mapping[str, PublishedDevice] = field(default_factory=dict)


def sharable_gpus(devices: Iterable[PublishedDevice]) -> bool | None:
    """Whether some of these devices is a GPU published for several allocations (a GPU share can be
    served); None when none of them is a GPU."""
    gpus = [d for d in devices if (n := dra.parse_device_name(d.name)) is not None and n.type == dra.TYPE_GPU]
    return any(d.shared for d in gpus) if gpus else None


def device_name(dtype: str, minor: int, vf_index: int | None = None) -> str:
    if dtype == GPU:
        return str(dra.DeviceName(dra.TYPE_GPU, minor))
    if vf_index is None:
        return str(dra.DeviceName(dra.TYPE_RDMA, minor))
    return str(dra.DeviceName(dra.TYPE_RDMA_VF, minor, vf_index))


def vf_index(slot: DeviceSlot, bus_id: str) -> int | None:
    """The index of a VF among its NIC's VFs in Device order (the `<vf>` of its device name)."""
    return next((i for i, vf in enumerate(slot.vfs) if vf.bus_id == bus_id), None)


def vf_of(inv: NodeInventory, name: dra.DeviceName) -> tuple[DeviceSlot, VF] | None:
    slot = inv.slot(RDMA, name.minor)
    if slot is None or name.vf is None or not 0 <= name.vf < len(slot.vfs):
        return None
    return slot, slot.vfs[name.vf]


def _whole(slot: DeviceSlot) -> dict[str, Quantity]:
    return {
        n: Quantity.of(v, Format.BINARY_SI if n == rn.GPU_MEMORY else Format.DECIMAL_SI)
        for n, v in slot.total.items()
    }


def vf_allocation(minor: int, vf: VF) -> DeviceAllocation:
    """One VF as the core counts it: 1% of its NIC and the VF itself."""
    return DeviceAllocation(minor, {rn.RDMA: Quantity.of(1)}, vfs=[AllocatedVF(vf.minor, vf.bus_id)])


def share_allocation(slot: DeviceSlot, consumed: Mapping[str, Quantity]) -> DeviceAllocation | None:
    """A share of a GPU as the core counts it (the device-plugin path's share resources: cores,
    memory bytes, and the memory ratio derived from them); None when it is the whole GPU. A
    capacity not consumed counts whole: a share that names no `cores` takes all the compute."""
    total = slot.total.get(rn.GPU_MEMORY, 0)
    cores = consumed.get(dra.CAPACITY_CORES)
    memory = consumed.get(dra.CAPACITY_MEMORY)
    res = {
        rn.GPU_CORE: dra.GPU_CORES if cores is None else cores.value(),
        rn.GPU_MEMORY: total if memory is None else memory.value(),
    }
    if res[rn.GPU_CORE] >= dra.GPU_CORES and res[rn.GPU_MEMORY] >= total:
        return None
    return DeviceAllocation(slot.minor, GPUHandler().resources(res, slot), id=slot.id)


def results_usage(
    inv: NodeInventory | None, pool: str, results: Iterable[DeviceResult]
) -> tuple[DeviceAllocations, list[str]]:
    """What a claim's results of topoalloc.io in `pool` take (whole GPUs, whole NICs, single VFs),
    whoever allocated them; and the devices that could not be counted (not in the Device CR, or no
    Device yet), for a warning."""
    out: dict[str, list[DeviceAllocation]] = {}
    missing = []
    for r in results:
        if r.driver != dra.DRIVER or r.pool != pool or r.admin_access:
            continue  # another driver's or another pool's; adminAccess takes nothing
        name = dra.parse_device_name(r.device)
        if name is None or inv is None:
            missing.append(r.device)
            continue
        if name.type == dra.TYPE_RDMA_VF:
            found = vf_of(inv, name)
            if found is None:
                missing.append(r.device)
                continue
            out.setdefault(RDMA, []).append(vf_allocation(name.minor, found[1]))
            continue
        dtype = name.device_type
        slot = inv.slot(dtype, name.minor)
        if slot is None:
            missing.append(r.device)
            continue
        if not slot.total:
            continue  # unhealthy: nothing can be chosen there anyway
        share = (
            share_allocation(slot, dict(r.consumed)) if r.consumed and r.share_id and dtype == GPU else None
        )
        out.setdefault(dtype, []).append(share or DeviceAllocation(name.minor, _whole(slot), id=slot.id))
    return DeviceAllocations(out), missing


def pool_devices(pool: str, slices: Iterable[ResourceSlice]) -> NodeDevices | None:
    """The pool's devices from its slices of topoalloc.io: those of the highest generation, once
    all `resourceSliceCount` of them are there; None while the pool is incomplete."""
    mine = [s for s in slices if s.driver == dra.DRIVER and s.pool == pool]
    if not mine:
        return None
    top = max(s.generation for s in mine)
    current = [s for s in mine if s.generation == top]
    if len(current) < current[0].slice_count:
        return None
    devices = {
        dev.name: PublishedDevice(
            dev.name,
            dra.DRIVER,
            dict(dev.attributes),
            dict(dev.capacity),
            dev.taints,
            dev.shared,
            dict(dev.capacities),
        )
        for s in sorted(current, key=lambda s: s.name)
        for dev in s.devices
    }
    return NodeDevices(pool, devices)
