"""Reservations on one node without a cluster: what `topoalloc allocate --reservation` and the
simulator need. `hold_rooms` counts each Reservation's room on a node state (placing those not yet
placed, as the controller would, and taking out what their owners among the assigned pods took);
`allocate_pod` then places a pod the way the allocator's bind does: from a room it may use (the
first in reservation order that takes it), ignoring rooms when it is labelled so, else the node's
own devices with every room counted as used. Each step is said in `notes` for --explain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.node.state import NodeState
from allocator.core.reasons import Rejection
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from allocator.core.reservation.consume import allocate_from_room, allocate_ignoring, in_room
from allocator.core.reservation.match import mismatch, pod_side
from allocator.core.reservation.room import Room, remaining
from allocator.core.scoring.device import DeviceScoring
from apis import keys
from apis import reservation as rv
from apis.annotations import DeviceAllocations, parse_device_allocated
from apis.errors import CodecError
from apis.reservation import Reservation
from apis.reservation_pod import RESERVATION_ALLOCATED, RESERVATION_ORDER, parse_reservation_allocated


@dataclass
class NodeRoom:
    res: Reservation
    room: Room
    owners: int  # owners already bound

    @property
    def order(self) -> tuple[float, str]:
        try:
            order = int(self.res.labels.get(RESERVATION_ORDER, "0"))
        except ValueError:
            order = 0
        return (order if order > 0 else float("inf"), self.res.name)


@dataclass
class Outcome:
    result: Allocation | Rejection
    room: str = ""  # the Reservation it took from
    notes: list[str] = field(default_factory=list)


def hold_rooms(
    state: NodeState,
    reservations: Iterable[Reservation],
    assigned: Iterable[Mapping[str, Any]] = (),
    *,
    scoring: DeviceScoring | None = None,
) -> tuple[list[NodeRoom], list[str]]:
    """Count the rooms of `reservations` on `state` (placed on this node, or placed here now) and
    return them with warnings for those that are not rooms here."""
    taken: dict[str, list[DeviceAllocations | None]] = {}
    for pod in assigned:
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(RESERVATION_ALLOCATED)
        if raw:
            try:
                name = parse_reservation_allocated(raw).name
                devices = (pod.get("metadata") or {}).get("annotations", {}).get(keys.DEVICE_ALLOCATED)
                taken.setdefault(name, []).append(parse_device_allocated(devices) if devices else None)
            except CodecError:
                continue
    rooms, warnings = [], []
    for res in reservations:
        if res.phase in (rv.SUCCEEDED, rv.FAILED):
            warnings.append(f"reservation {res.name} is {res.phase}: it holds nothing")
            continue
        req = pod_request(res.template_pod())
        reserved = res.reserved
        if reserved is not None and res.node and res.node != state.name:
            warnings.append(f"reservation {res.name} is on node {res.node}, not {state.name}")
            continue
        if reserved is None:
            got = allocate(state, req, scoring=scoring)
            if isinstance(got, Rejection):
                warnings.append(f"reservation {res.name} does not fit on {state.name}: {got.explained}")
                continue
            reserved = got.devices
        room = _room(res, state.name, reserved, req, taken.get(res.name, []))
        state.add_pod(room.key, room.remaining, room.cpu_milli, room.memory)
        rooms.append(NodeRoom(res, room, len(taken.get(res.name, []))))
    return sorted(rooms, key=lambda r: r.order), warnings


def _room(
    res: Reservation,
    node: str,
    reserved: DeviceAllocations,
    req: PodRequest,
    taken: list[DeviceAllocations | None],
) -> Room:
    return Room(
        res.name, node, reserved, remaining(reserved, taken), res.restricted,
        req.cpu_milli, req.memory, req.cpu_milli, req.memory,
    )  # fmt: skip


def allocate_pod(
    state: NodeState,
    pod: Mapping[str, Any],
    req: PodRequest,
    rooms: list[NodeRoom],
    *,
    scoring: DeviceScoring | None = None,
    now: float | None = None,
) -> Outcome:
    """The pod's devices on this node as bind would choose them with these rooms."""
    side = pod_side(pod)
    notes: list[str] = []
    if side.ignored:
        notes.append("reservation-ignored: every room's unallocated part counts as free")
        return Outcome(
            allocate_ignoring(state, req, [r.room.key for r in rooms], scoring=scoring, explain=notes),
            "",
            notes,
        )
    first: Rejection | None = None
    for r in rooms:
        why = mismatch(r.res, side, state.labels) or _unusable(r, now)
        if why is not None:
            notes.append(f"reservation {r.res.name}: not used: {why}")
            continue
        got = allocate_from_room(state, req, r.room, scoring=scoring, explain=notes)
        policy = r.res.policy or "Aligned (default)"
        if isinstance(got, Allocation):
            notes.append(f"reservation {r.res.name} used ({policy})")
            return Outcome(got, r.res.name, notes)
        notes.append(f"reservation {r.res.name}: does not take the pod ({policy}): {got.explained}")
        first = first or got
    if side.required or side.error:
        why = first or Rejection(
            "Reservation(s) none matched", "Reservation(s) no reservation the pod may use is available"
        )
        return Outcome(in_room(why), "", notes)
    if rooms:
        notes.append("no reservation used: the node's own devices, every room counted as used")
    return Outcome(allocate(state, req, scoring=scoring, explain=notes), "", notes)


def _unusable(r: NodeRoom, now: float | None) -> str | None:
    res = r.res
    if now is not None and res.expiry() <= now:
        return "it has expired"
    if res.allocate_once and r.owners:
        return "allocateOnce, and it has an owner already"
    limit = res.pod_limit()
    if limit is not None and r.owners >= limit:
        return f"it has its {limit} owners"
    return None
