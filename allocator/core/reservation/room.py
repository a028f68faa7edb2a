"""A placed Reservation as the core counts it: a *room* on one node, the devices (and cpu, memory)
it reserved and what is left of them once its owners took their share.

The core's node state counts a room as one entry (key `room_key(name)`) holding what is *left*;
each owner pod counts as itself. So the node's use is always pods + what rooms still hold, and an
owner that takes part of a room moves that part from the room's entry to its own, never twice.
`remaining` computes what is left from the reserved devices and the owners' allocations: the
allocator rebuilds every room from the API alone (Reservations' `device-allocated`, pods'
`reservation-allocated` and `device-allocated`) after a restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from allocator.core.devices.context import Bounds
from allocator.core.request.usage import ROOM_KEY_PREFIX
from apis.annotations import AllocatedVF, DeviceAllocation, DeviceAllocations
from apis.quantity import Quantity


def room_key(name: str) -> str:
    """The key a Reservation's room is counted under in the core's node state."""
    return ROOM_KEY_PREFIX + name


def is_room(key: str) -> bool:
    return key.startswith(ROOM_KEY_PREFIX)


@dataclass(frozen=True)
class Room:
    """What the core needs of a placed Reservation to let its owners use it."""

    name: str
    node: str
    reserved: DeviceAllocations
    remaining: DeviceAllocations
    restricted: bool = False  # allocatePolicy Restricted: reserved device types only from the room
    cpu_milli: int = 0  # what is left of the reserved cpu and memory
    memory: int = 0
    reserved_cpu_milli: int = 0
    reserved_memory: int = 0

    @property
    def key(self) -> str:
        return room_key(self.name)

    def bounds(self) -> dict[str, dict[int, dict[str, int]]]:
        """What an owner may take per device type and minor (the core's `allocate(required=)`)."""
        return {
            dtype: {a.minor: {n: q.value() for n, q in (a.resources or {}).items()} for a in entries}
            for dtype, entries in self.remaining.by_type.items()
        }

    @property
    def empty(self) -> bool:
        """Nothing left to hand out: every reserved device used up (cpu and memory too)."""
        left = any(
            q.value() > 0
            for entries in self.remaining.by_type.values()
            for a in entries
            for q in (a.resources or {}).values()
        )
        return not left and self.cpu_milli <= 0 and self.memory <= 0


def remaining(reserved: DeviceAllocations, taken: Iterable[DeviceAllocations | None]) -> DeviceAllocations:
    """The reserved devices less what owners took of them, per type, minor and resource (never
    below zero; devices the room never reserved are the node's, not the room's). A minor stays
    listed with zeros once used up, so a Restricted owner still finds it bounded to nothing. VFs:
    those the owners took are no longer the room's; an owner that took another VF of a reserved
    NIC takes one of the room's in its place."""
    used: dict[tuple[str, int], dict[str, int]] = {}
    vfs_taken: dict[tuple[str, int], list[str]] = {}
    for allocs in taken:
        if allocs is None:
            continue
        for dtype, entries in allocs.by_type.items():
            for a in entries:
                slot = used.setdefault((dtype, a.minor), {})
                for n, q in (a.resources or {}).items():
                    slot[n] = slot.get(n, 0) + q.nanos
                vfs_taken.setdefault((dtype, a.minor), []).extend(vf.bus_id for vf in a.vfs)
    out: dict[str, list[DeviceAllocation]] = {}
    for dtype, entries in reserved.by_type.items():
        kept = []
        for a in entries:
            took = used.get((dtype, a.minor), {})
            resources = {
                n: Quantity(max(0, q.nanos - took.get(n, 0)), q.format)
                for n, q in (a.resources or {}).items()
            }
            kept.append(
                DeviceAllocation(
                    a.minor, resources, a.id, _vfs_left(a.vfs, vfs_taken.get((dtype, a.minor), []))
                )
            )
        out[dtype] = kept
    return DeviceAllocations(out)


def _vfs_left(reserved: list[AllocatedVF], taken: list[str]) -> list[AllocatedVF]:
    left = [vf for vf in reserved if vf.bus_id not in taken]
    others = sum(1 for bus in taken if bus not in {vf.bus_id for vf in reserved})
    return left[others:]


def consumed(remaining_before: DeviceAllocations, allocation: DeviceAllocations) -> bool:
    """Whether an owner's allocation takes anything from the room (a device the room holds)."""
    held = {(t, a.minor) for t, entries in remaining_before.by_type.items() for a in entries}
    return any((t, a.minor) in held for t, entries in allocation.by_type.items() for a in entries)


def unbounded(
    bounds: Bounds, types: Iterable[str], totals: Mapping[str, Mapping[int, Mapping[str, int]]]
) -> Bounds:
    """`bounds` plus, for each of `types` the room did not reserve, every device of the node at its
    total: a Restricted room bounds only the device types it holds (the rest comes from the node)."""
    out = dict(bounds)
    for dtype in types:
        if dtype not in out:
            out[dtype] = totals.get(dtype, {})
    return out
