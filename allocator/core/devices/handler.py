"""The seam per device type: what `allocate` asks of a device type, and nothing more.

A new device type (a NIC class, a DRA device, another accelerator) is one module with a class
that has these three methods, registered in `registry.HANDLERS`; `allocate` does not change.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from allocator.core.devices.context import Ctx, Pick
from allocator.core.node.inventory import DeviceSlot
from allocator.core.reasons import Rejection
from allocator.core.request.pod_request import Resources


@runtime_checkable
class DeviceHandler(Protocol):
    def demand(self, ctx: Ctx, resources: Resources) -> tuple[Resources, int] | Rejection:
        """The request per device and how many devices the pod wants of this type (protocol 7.3),
        from the pod's resources of this type; or why the request cannot be met on this node."""
        ...

    def choose(
        self, ctx: Ctx, per: Resources, desired: int, pcies: frozenset[str], *, need_picks: bool
    ) -> tuple[list[Pick], str] | Rejection:
        """The devices for the pod (at least `desired`; `pcies`: the PCIe switches of a joint
        allocation's primary type) and the path taken ("" where the type has one path); or why not.
        `need_picks=False`: only the verdict matters, the picks may be left empty."""
        ...

    def resources(self, chosen: dict[str, int], slot: DeviceSlot) -> dict[str, int]:
        """The resources written into the device-allocated annotation for one chosen device."""
        ...
