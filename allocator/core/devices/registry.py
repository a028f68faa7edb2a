"""The device types `allocate` knows, each with its handler (one module per kind of handler)."""

from __future__ import annotations

from collections.abc import Mapping

from allocator.core.devices.gpu import GPUHandler
from allocator.core.devices.handler import DeviceHandler
from allocator.core.devices.plain import PerDeviceHandler
from apis import resources as rn

HANDLERS: Mapping[str, DeviceHandler] = {
    rn.DeviceType.GPU: GPUHandler(),
    rn.DeviceType.RDMA: PerDeviceHandler(rn.DeviceType.RDMA, rn.RDMA),
    rn.DeviceType.FPGA: PerDeviceHandler(rn.DeviceType.FPGA, rn.FPGA),
}
