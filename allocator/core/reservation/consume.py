"""An owner pod's devices from a room (Koordinator's reservation restore, protocol 7.7), and a
reservation-ignored pod's devices with every room's unallocated part counted free.

Both work on a private copy of the node (`fork_node`) with the room's entry (or every room's)
taken out, so nothing here changes the cluster. The owner's allocation then takes, per device the
room holds, from what is left of the room:

* Restricted: the device types the room reserved come from the room only, bounded per minor by
  what is left of it (`allocate(required=...)`); other types, and cpu and memory the room did not
  reserve, from the node.
* Aligned (and Koordinator's deprecated Default): the room's devices alone when they are enough;
  otherwise the normal device choice over the room's remaining devices and the node's free ones
  together (topology first), so a pod larger than its room still lands in one piece.
A failure is said as Koordinator says it: "Reservation(s) <reason>".
"""

from __future__ import annotations

from collections.abc import Iterable

from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.gang.plan import fork_node
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.pod_request import PodRequest
from allocator.core.reservation.room import Room, unbounded
from allocator.core.scoring.device import DeviceScoring
from apis.annotations import DeviceAllocations

PREFIX = "Reservation(s) "


def in_room(rejection: Rejection) -> Rejection:
    """A rejection as Koordinator reports a pod that fits no reservation of its own."""
    if rejection.message.startswith(PREFIX):
        return rejection
    return Rejection(
        PREFIX + rejection.code, PREFIX + rejection.message, rejection.unresolvable, rejection.detail
    )


def without(state: NodeState, keys: Iterable[str]) -> NodeState:
    """A private copy of the node with these entries (rooms) taken out."""
    fork = fork_node(state)
    for key in keys:
        fork.remove_pod(key)
    return fork


def allocate_from_room(
    state: NodeState,
    req: PodRequest,
    room: Room,
    *,
    scoring: DeviceScoring | None = None,
    explain: list[str] | None = None,
) -> Allocation | Rejection:
    """The devices an owner gets on the room's node, the room's own first (module docstring)."""
    if req.invalid is not None:
        return req.invalid
    short = _short_of(req, room)
    if short is not None:
        return short
    fork = without(state, [room.key])
    if not req.devices:
        return Allocation(DeviceAllocations({}))
    inv = fork.inventory
    totals = (
        {} if inv is None else {t: {s.minor: dict(s.total) for s in inv.slots(t)} for t in req.device_types}
    )
    bounds = unbounded(room.bounds(), req.device_types, totals)
    got = allocate(fork, req, scoring=scoring, required=bounds, explain=explain)
    if isinstance(got, Allocation):
        return got
    if room.restricted:
        return in_room(got)
    wide = allocate(fork, req, scoring=scoring, explain=explain)
    return wide if isinstance(wide, Allocation) else in_room(wide)


def allocate_ignoring(
    state: NodeState,
    req: PodRequest,
    rooms: Iterable[str],
    *,
    scoring: DeviceScoring | None = None,
    explain: list[str] | None = None,
) -> Allocation | Rejection:
    """A reservation-ignored pod's devices: every room's unallocated part counts as free."""
    return allocate(without(state, rooms), req, scoring=scoring, explain=explain)


def _short_of(req: PodRequest, room: Room) -> Rejection | None:
    """Restricted: cpu and memory the room reserved come from the room only."""
    if not room.restricted:
        return None
    if room.reserved_cpu_milli and req.cpu_milli > room.cpu_milli:
        return Rejection(
            PREFIX + "Insufficient cpu", PREFIX + "Insufficient cpu", detail=f"{room.cpu_milli}m left"
        )
    if room.reserved_memory and req.memory > room.memory:
        return Rejection(
            PREFIX + "Insufficient memory", PREFIX + "Insufficient memory", detail=f"{room.memory} bytes left"
        )
    return None
