"""The seam per device type: what `allocate` asks of a device type, and nothing more.

A new device type (a NIC class, a DRA device, another accelerator) is one module with a class
that has these methods, registered in `registry.HANDLERS`; `allocate` does not change. Node
summaries a type keeps (bitmasks, free shares) are its class in `node/summaries.py`, one layer
down, since the node state and the scorers read them too.
"""

from __future__ import annotations

from typing import Final, Protocol, runtime_checkable

from allocator.core.devices.context import Ctx, Pick
from allocator.core.node.features import Feature
from allocator.core.node.inventory import DeviceSlot, NodeInventory
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.pod_request import PodRequest, Resources
from apis.quantity import Quantity


class Undecided:
    """A quick verdict that needs the full allocation to decide."""

    def __repr__(self) -> str:
        return "UNDECIDED"


UNDECIDED: Final = Undecided()


@runtime_checkable
class DeviceHandler(Protocol):
    # Whether `choose(need_picks=False)` costs less than choosing: `allocate` then asks it first
    # when more types follow, since a type that cannot be allocated makes the rest moot.
    verdict_without_picks: bool

    def admit(self, state: NodeState, req: PodRequest) -> Rejection | None:
        """Why the node refuses the pod's request of this type before any device is looked at
        (asked for every requested type, before `demand`), or None."""
        ...

    def quick_verdict(self, state: NodeState, req: PodRequest) -> Rejection | Undecided | None:
        """`allocate.fits` for a pod that requests this type alone, from node summaries where they
        decide it (None: it fits), else UNDECIDED. Must agree with `choose` exactly."""
        ...

    def grouping(self, req: PodRequest) -> Feature | None:
        """For a pod that requests this type alone: a node feature coarser than the node's full
        device usage that decides `allocate.fits` (nodes equal in it get the same verdict), or
        None to group by full usage."""
        ...

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

    def joint_scopes(self, inv: NodeInventory, picks: list[Pick]) -> frozenset[str]:
        """The PCIe scopes of chosen devices: a joint allocation's other types follow the
        primary's, and with SamePCIe must end up on exactly the same."""
        ...

    def resources(self, chosen: dict[str, int], slot: DeviceSlot | None) -> dict[str, Quantity]:
        """The resources written into the device-allocated annotation for one chosen device
        (`slot`: the device, None when the inventory does not have it)."""
        ...
