"""The book of Reservations and their rooms, kept from the watch cache (every change it takes in).

Per Reservation: the object as read (or why it does not decode), its template's request, and its
room once placed: the reserved devices, cpu and memory on one node, less what its owners took. An
owner is a bound pod whose `reservation-allocated` names the Reservation, or a bind in flight that
took from it (the ledger's placer, `take`). Whenever either changes, what is left is held anew in
the hold ledger (`hold_room`), which the core counts as used for everyone else.

Everything here is rebuilt from the API on the first LIST: a Reservation that is Available with its
`device-allocated` annotation holds its room again, and its owners' pods (bound, with
`reservation-allocated`) take their share back out of it; a restart loses nothing.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from allocator.core.reservation.match import PodSide, mismatch
from allocator.core.reservation.room import Room, remaining, room_key
from allocator.reservations.cache_view import ReservationCache
from allocator.reservations.owners import OwnerIndex
from allocator.runtime.cache.records import Hold
from allocator.runtime.coreadapter import CoreAdapter, PodRequest
from apis import reservation as rv
from apis.annotations import DeviceAllocations
from apis.errors import CodecError
from apis.reservation import Reservation
from apis.reservation_pod import (
    RESERVATION_ALLOCATED,
    RESERVATION_ORDER,
    RESOURCE_STATUS,
    parse_reservation_allocated,
)
from apis.resources import TERMINAL_POD_PHASES

log = logging.getLogger(__name__)

JSON = dict[str, Any]


@dataclass
class Entry:
    name: str
    raw: JSON
    res: Reservation | None = None
    error: str = ""  # why the object does not decode
    req: PodRequest | None = None  # the template's request
    room: Room | None = None  # held on a node now
    numa: int | None = None  # the NUMA node of its devices, when the template asked for one
    placed_here: bool = False  # held by this process before the API showed it Available
    victims: tuple[str, ...] = ()  # preempted pods still leaving; the room waits for them
    held_since: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def uid(self) -> str:
        return str((self.raw.get("metadata") or {}).get("uid") or "")

    @property
    def order(self) -> tuple[float, str]:
        labels = self.res.labels if self.res is not None else {}
        try:
            order = int(labels.get(RESERVATION_ORDER, "0"))
        except ValueError:
            order = 0
        return (order if order > 0 else math.inf, self.name)


class RoomBook:
    def __init__(
        self, cache: ReservationCache, core: CoreAdapter, *, wall: Callable[[], float] = time.time
    ) -> None:
        self.cache = cache
        self.core = core
        self.wall = wall
        self.entries: dict[str, Entry] = {}
        self.by_node: dict[str, set[str]] = defaultdict(set)  # rooms held per node
        self.owners = OwnerIndex()
        self.consumers: dict[str, set[str]] = defaultdict(set)  # room -> bound owner pod keys
        self.pod_room: dict[str, str] = {}  # bound owner -> its room
        # room -> binding owner -> (its allocations, cpu milli, memory)
        self.pending: dict[str, dict[str, tuple[DeviceAllocations, int, int]]] = defaultdict(dict)
        self.cpu_nodes: dict[str, int] = defaultdict(int)  # node -> rooms there holding cpu or memory
        self.version = 0
        # Reservations changed since the controller last looked (it looks at the rest only every
        # resync period: a busy cluster's every pod event must not cost a pass over all of them).
        self.dirty: set[str] = set()
        # Nodes where room was given back (released, or an owner's share back in its room) since
        # the controller last looked: it offers that room to the pods kube-scheduler holds back.
        self.freed: set[str] = set()
        self.victim_of: dict[str, str] = {}  # a pod evicted for a room placed here -> the room

    # -- the watch ---------------------------------------------------------------------------------

    def observe(self, kind: str, key: str, obj: JSON | None) -> None:
        if kind == rv.KIND:
            if obj is None:
                self._forget(key)
            else:
                self._upsert(key, obj)
        elif kind == "Pod":
            self._pod(key, obj)

    def _upsert(self, name: str, obj: JSON) -> None:
        entry = self.entries.get(name)
        if entry is not None and entry.uid != str((obj.get("metadata") or {}).get("uid") or ""):
            self._forget(name)  # deleted and created again under the same name
            entry = None
        if entry is None:
            entry = self.entries[name] = Entry(name, obj)
        entry.raw = obj
        try:
            res = Reservation.from_dict(obj)
        except CodecError as exc:
            entry.res, entry.error, entry.req = None, str(exc), None
            self.owners.remove(name)
            self.release(name)
            self.dirty.add(name)
            return
        entry.res, entry.error = res, ""
        if RESOURCE_STATUS in res.annotations:  # written with the room: handed to its owners
            entry.extra = {RESOURCE_STATUS: res.annotations[RESOURCE_STATUS]}
        pod = res.template_pod()
        pod["metadata"]["resourceVersion"] = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        entry.req = self.core.request(pod)
        self.owners.set(name, res.owners)
        if res.deleting or res.phase in (rv.SUCCEEDED, rv.FAILED):
            self.release(name)
        elif res.phase == rv.AVAILABLE and res.node:
            # Placed (here or by another scheduler): no device-allocated means no devices held.
            reserved = res.reserved if res.reserved is not None else DeviceAllocations({})
            entry.placed_here = False
            self.set_victims(name, ())
            if entry.room is None or entry.room.node != res.node or entry.room.reserved != reserved:
                self.hold(name, res.node, reserved)
        elif entry.room is not None and not entry.placed_here:
            self.release(name)  # Pending again (someone reset the status): placed anew
        self.version += 1
        self.dirty.add(name)

    def _forget(self, name: str) -> None:
        self.release(name)
        self.owners.remove(name)
        self.entries.pop(name, None)
        self.version += 1

    def _pod(self, key: str, obj: JSON | None) -> None:
        if key in self.victim_of:
            self.dirty.add(self.victim_of[key])  # a room waiting for its victims looks again
        room = _room_of(obj)
        old = self.pod_room.get(key)
        if room == old:
            if room:
                self._recount(room)  # its allocations may have changed (a resize)
            return
        if old:
            self.pod_room.pop(key, None)
            self.consumers[old].discard(key)
            self._recount(old)
        if room:
            self.pod_room[key] = room
            self.consumers[room].add(key)
            self._recount(room)

    # -- rooms ---------------------------------------------------------------------------------------

    def hold(
        self, name: str, node: str, reserved: DeviceAllocations, *, numa: int | None = None
    ) -> Room | None:
        """Hold `reserved` on `node` for the Reservation (placed here, or read back)."""
        entry = self.entries.get(name)
        if entry is None or entry.res is None or entry.req is None:
            return None
        if entry.room is not None and entry.room.node != node:
            self.release(name)
        fresh = entry.room is None
        req = entry.req
        entry.room = Room(
            name, node, reserved, reserved, entry.res.restricted,
            req.cpu_milli, req.memory, req.cpu_milli, req.memory,
        )  # fmt: skip
        if numa is not None:
            entry.numa = numa
        if fresh:
            entry.held_since = self.wall()
            self.by_node[node].add(name)
            if req.cpu_milli or req.memory:
                self.cpu_nodes[node] += 1
        self._recount(name)
        return entry.room

    def release(self, name: str) -> None:
        """Give the room back (expired, used up, deleted, failed)."""
        entry = self.entries.get(name)
        if entry is None or entry.room is None:
            return
        node = entry.room.node
        if entry.room.reserved_cpu_milli or entry.room.reserved_memory:
            self.cpu_nodes[node] -= 1
            if self.cpu_nodes[node] <= 0:
                del self.cpu_nodes[node]
        self.set_victims(name, ())
        entry.room, entry.placed_here, entry.held_since = None, False, 0.0
        self.freed.add(node)
        names = self.by_node.get(node)
        if names is not None:
            names.discard(name)
            if not names:
                del self.by_node[node]
        self.cache.ledger.drop_room(room_key(name))
        self.version += 1

    def hold_placed(
        self,
        name: str,
        node: str,
        reserved: DeviceAllocations,
        *,
        numa: int | None,
        victims: tuple[str, ...],
        extra: dict[str, str],
    ) -> None:
        """A room placed by this process: held at once, written once `victims` are gone."""
        if self.hold(name, node, reserved, numa=numa) is None:
            return
        entry = self.entries[name]
        entry.placed_here, entry.extra = True, extra
        self.set_victims(name, victims)

    def set_victims(self, name: str, victims: tuple[str, ...]) -> None:
        """The pods a room placed here waits for (none: it may be written)."""
        entry = self.entries.get(name)
        if entry is None:
            return
        for key in entry.victims:
            self.victim_of.pop(key, None)
        entry.victims = victims
        for key in victims:
            self.victim_of[key] = name

    def take_freed(self) -> set[str]:
        freed, self.freed = self.freed, set()
        return freed

    def take_dirty(self) -> set[str]:
        dirty, self.dirty = self.dirty, set()
        return dirty

    def take(self, name: str, key: str, req: PodRequest, allocations: DeviceAllocations) -> None:
        """A bind in flight (pod `key`) takes `allocations` and its cpu and memory from the room,
        until the ledger lets go of it (`dropped`)."""
        self.pending[name][key] = (allocations, req.cpu_milli, req.memory)
        self._recount(name)

    def moved(self, old_key: str, entry: Hold) -> None:
        """A hold made ahead (at admission) became its pod's: what it took is the pod's now."""
        pending = self.pending.get(entry.room) if entry.room else None
        if pending is not None and pending.pop(old_key, None) is not None:
            pending[entry.key] = (entry.allocations, entry.request.cpu_milli, entry.request.memory)
            self._recount(entry.room)

    def dropped(self, entry: Hold) -> None:
        """The ledger let go of a bind that took from a room (bound, failed or expired)."""
        if entry.room and self.pending.get(entry.room, {}).pop(entry.key, None) is not None:
            self._recount(entry.room)

    def _recount(self, name: str) -> None:
        entry = self.entries.get(name)
        if entry is None or entry.room is None:
            return
        room = entry.room
        pods = self.cache.pods
        taken: list[DeviceAllocations | None] = []
        cpu = mem = 0
        for key in self.consumers.get(name, ()):
            pod = pods.get(key)
            if pod is not None and pod.holds and pod.usage is not None:
                taken.append(pod.usage.allocations)
                cpu, mem = cpu + pod.usage.cpu_milli, mem + pod.usage.memory
        for allocations, pod_cpu, pod_mem in self.pending.get(name, {}).values():
            taken.append(allocations)
            cpu, mem = cpu + pod_cpu, mem + pod_mem
        left = remaining(room.reserved, taken)
        cpu_left = max(0, room.reserved_cpu_milli - cpu)
        mem_left = max(0, room.reserved_memory - mem)
        entry.room = replace(room, remaining=left, cpu_milli=cpu_left, memory=mem_left)
        if _more(entry.room, room):
            self.freed.add(room.node)  # an owner's share is back in the room
        held = PodRequest(
            key=room.key,
            cpu_milli=cpu_left,
            memory=mem_left,
            nonzero_cpu_milli=cpu_left,
            nonzero_memory=mem_left,
        )
        self.cache.ledger.hold_room(room.key, room.node, left, held)
        self.version += 1
        self.dirty.add(name)

    # -- questions -------------------------------------------------------------------------------------

    def owners_of(self, name: str) -> list[str]:
        """Pod keys of its owners: bound ones, then binds in flight."""
        return sorted(self.consumers.get(name, ())) + sorted(self.pending.get(name, {}))

    def full(self, entry: Entry) -> bool:
        """No new owner may take from it: allocateOnce and already taken, or its pod count reached."""
        res = entry.res
        if res is None:
            return True
        owners = len(self.consumers.get(entry.name, ())) + len(self.pending.get(entry.name, {}))
        if res.allocate_once and owners:
            return True
        try:
            limit = res.pod_limit()
        except CodecError:
            return True
        return limit is not None and owners >= limit

    def usable(self, entry: Entry, now: float) -> bool:
        """Owners may be placed in it now: Available in the API, held here, not full or expired."""
        res = entry.res
        return (
            res is not None
            and entry.room is not None
            and not entry.victims
            and res.phase == rv.AVAILABLE
            and res.node == entry.room.node
            and not res.deleting
            and res.expiry() > now
            and not self.full(entry)
        )

    def matching(self, side: PodSide, node: str | None = None) -> list[Entry]:
        """The rooms `side` may use now (on `node`, when given), in the order they are tried."""
        now = self.wall()
        found = []
        names = self.owners.candidates(side.meta) if node is None else self.by_node.get(node, ())
        for name in names:
            entry = self.entries.get(name)
            if entry is None or entry.res is None or not self.usable(entry, now):
                continue
            assert entry.room is not None
            if mismatch(entry.res, side, self.node_labels(entry.room.node)) is None:
                found.append(entry)
        return sorted(found, key=lambda e: e.order)

    def reasons(self, side: PodSide) -> dict[str, str]:
        """Why each Reservation the pod could own is not one it may use now (for --explain, Events)."""
        now = self.wall()
        out = {}
        for name in sorted(self.owners.candidates(side.meta)):
            entry = self.entries.get(name)
            if entry is None:
                continue
            if entry.res is None:
                out[name] = f"it is invalid: {entry.error}"
            elif (why := mismatch(entry.res, side, self.node_labels(entry.res.node))) is not None:
                out[name] = why
            elif not self.usable(entry, now):
                out[name] = self.unusable_why(entry, now)
        return out

    def unusable_why(self, entry: Entry, now: float) -> str:
        res = entry.res
        if res is None:
            return "it is invalid"
        if res.expiry() <= now:
            return "it has expired"
        if res.phase != rv.AVAILABLE or entry.room is None or entry.victims:
            return f"it is {res.phase or rv.PENDING}, not Available"
        if self.full(entry):
            return "it has no room for another owner (allocateOnce or its pod count)"
        return "it is not available"

    def node_labels(self, node: str) -> dict[str, str]:
        facts = self.cache.nodes.get(node)
        return dict(facts.labels) if facts is not None else {}

    def rooms_on(self, node: str) -> Iterable[str]:
        return [room_key(n) for n in self.by_node.get(node, ())]


def _more(now: Room, before: Room) -> bool:
    """`now` has more left than `before`: devices (or shares of them), cpu or memory."""
    return (
        _amount(now.remaining) > _amount(before.remaining)
        or now.cpu_milli > before.cpu_milli
        or now.memory > before.memory
    )


def _amount(allocations: DeviceAllocations) -> int:
    return sum(
        1 + sum(q.value() for q in (a.resources or {}).values())
        for entries in allocations.by_type.values()
        for a in entries
    )


def _room_of(pod: JSON | None) -> str:
    """The Reservation a bound, running pod took from ("" for none)."""
    if pod is None:
        return ""
    meta = pod.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(RESERVATION_ALLOCATED)
    if not raw or not (pod.get("spec") or {}).get("nodeName"):
        return ""
    if (pod.get("status") or {}).get("phase") in TERMINAL_POD_PHASES:
        return ""
    try:
        return parse_reservation_allocated(raw).name
    except CodecError:
        log.warning(
            "pod %s/%s: %s does not parse", meta.get("namespace"), meta.get("name"), RESERVATION_ALLOCATED
        )
        return ""
