"""Building `device-allocated` entries for pods that already hold devices (tests and benchmarks)."""

from __future__ import annotations

from apis import resources as rn
from apis.annotations import AllocatedVF, DeviceAllocation
from apis.quantity import Format, Quantity


def entry(minor: int, resources: dict[str, int], vf: str | None = None) -> DeviceAllocation:
    """One allocation entry: integer resources (gpu-memory in bytes) and optionally one VF."""
    res = {
        n: Quantity.of(v, Format.BINARY_SI if n == rn.GPU_MEMORY else Format.DECIMAL_SI)
        for n, v in resources.items()
    }
    out = DeviceAllocation(minor, res)
    if vf is not None:
        out.vfs = [AllocatedVF(-1, vf)]
    return out
