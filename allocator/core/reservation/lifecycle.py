"""The Reservation lifecycle: one pure step per pass, deciding; the controller acts
(allocator/reservations/controller.py).

    step(view, now, door, settings) -> actions

`view` is what the pass looks at (view.py), `now` the wall clock, `door` the cluster (door.py: the
core's placements, the hold ledger's changes applied at once, the pods kube-scheduler holds back).
No I/O, no clock: the step returns the actions to carry out. Per Reservation, oldest first:

  * one that does not decode gets `Scheduled=False, reason Invalid` and an Event; it is never
    placed (fix the object and it is looked at anew);
  * one deleting, Succeeded or Failed is left alone (its room went back when the book saw it);
  * one past its `expires` (or creation + `ttl`) gives its room back: phase Failed, `Ready=False,
    reason Expired`; a live one is looked at again when it expires;
  * an Available one: its node gone, it fails; with allocateOnce and an owner bound it succeeds and
    gives the rest back; else `currentOwners` and `allocated` follow its owners;
  * one held here but not written is written once its victims are gone (those a budget refused
    are evicted again), or given back when they outstay `preemption_timeout`;
  * a Pending one of ours is placed with the same core as a pod; a gang of them (the
    `topoalloc.io/reservation-gang` label) all at once or not at all, inside one domain of its
    topology level. The room is held at once, then written: `device-allocated`, then the status.
    One that fits nowhere waits with `Scheduled=False, reason Unschedulable` and an Event, or, with
    a template priority, evicts the cheapest lower-priority pods while its room waits for them.

Room given back (by this pass, or seen by the book since the last one: a Reservation expired,
deleted, used up, failed, an owner gone) is offered at once to the pods kube-scheduler holds as
unschedulable: those the extender's filter would now pass on a freed node are nudged (`Nudge`), so
kube-scheduler tries them again now rather than after its five-minute flush.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from allocator.core.actions import Annotate, Event, Evict, Nudge, ObjectRef, Requeue, WriteStatus
from allocator.core.reservation import status as st
from allocator.core.reservation.door import Door, GangTopology, Placing, gang_levels
from allocator.core.reservation.view import GangSeen, PassView, Seen
from apis import keys
from apis import reservation as rv
from apis.annotations import DeviceAllocations
from apis.errors import CodecError

JSON = dict[str, Any]
ACTION = "Reserve"  # the Events' action


@dataclass(frozen=True)
class LifecycleSettings:
    preemption: bool = True
    preemption_timeout: float = 300.0
    scheduler_names: tuple[str, ...] = ()  # empty: every Reservation is ours to place
    # Freed room: at most `nudges` pods nudged a pass, among the first `looked_at` kube-scheduler
    # holds back (its queue order). A room takes a few pods; each nudge costs kube-scheduler one
    # scheduling attempt and the allocator one filter of the freed nodes.
    nudges: int = 16
    looked_at: int = 128


@dataclass(frozen=True)
class WriteInOrder:
    """Writes to one Reservation carried out one after the other, each only once the one before
    was taken (its devices before the status that says Available); then the Event, and `said`
    remembered as the condition note the object now carries ("" forgets it, None leaves it). A
    refused write brings the key back after its backoff pause."""

    key: str
    writes: tuple[Annotate | WriteStatus, ...]
    event: Event | None = None
    said: str | None = None


Action = WriteInOrder | Evict | Nudge | Requeue


def step(view: PassView, now: float, door: Door, settings: LifecycleSettings) -> list[Action]:
    turn = _Pass(view, now, door, settings)
    turn.run()
    return turn.actions


class _Pass:
    def __init__(self, view: PassView, now: float, door: Door, settings: LifecycleSettings) -> None:
        self.view = view
        self.now = now
        self.door = door
        self.settings = settings
        self.actions: list[Action] = []
        self.freed: set[str] = set(view.freed)

    def run(self) -> None:
        waiting: list[Seen] = []
        gangs: dict[str, list[Seen]] = {}
        for seen in sorted(self.view.reservations, key=lambda s: (s.created, s.name)):
            res = seen.res
            if res is None:
                status = st.invalid(seen.status, seen.error, self.now)
                self._say(seen, status, "Warning", "InvalidReservation", seen.error)
                continue
            if res.deleting or res.phase in (rv.SUCCEEDED, rv.FAILED):
                continue
            expiry = res.expiry()
            if expiry <= self.now:
                self._finish(seen, st.expired(res, self.now), "Expired", "the reservation expired")
                continue
            if math.isfinite(expiry):
                self.actions.append(Requeue(seen.name, expiry - self.now))
            if res.pre_allocation:
                note = "preAllocation is not supported by topoalloc; the reservation is not placed"
                status = st.unschedulable(res, note, self.now, "Unsupported")
                self._say(seen, status, "Warning", "FailedReserve", note)
            elif seen.room is not None and res.phase == rv.AVAILABLE:
                self._upkeep(seen)
            elif seen.room is not None and seen.room.placed_here:
                self._publish_when_ready(seen)
            elif not self._ours(res):
                continue  # another scheduler's to place
            elif res.gang:
                gangs.setdefault(res.gang, []).append(seen)
            else:
                waiting.append(seen)
        for seen in waiting:
            self._place([seen])
        for gang, members in sorted(gangs.items()):
            self._place_gang(members, self.view.gangs.get(gang, GangSeen()))
        self._nudge()

    # -- writing ---------------------------------------------------------------------------------

    def _say(self, seen: Seen, status: JSON, type_: str, reason: str, note: str) -> None:
        """A condition written (and an Event recorded) only when it says something new."""
        if seen.said == note:
            return
        event = Event(seen.ref, type_, reason, note, ACTION)
        self.actions.append(WriteInOrder(seen.name, (WriteStatus(seen.ref, status, seen.name),), event, note))

    def _finish(self, seen: Seen, status: JSON, reason: str, note: str) -> None:
        self._release(seen.name)
        type_ = "Warning" if reason == "Failed" else "Normal"
        event = Event(seen.ref, type_, f"Reservation{reason}", note, ACTION)
        self.actions.append(WriteInOrder(seen.name, (WriteStatus(seen.ref, status, seen.name),), event))

    def _release(self, name: str) -> None:
        node = self.door.release_room(name)
        if node:
            self.freed.add(node)

    def _publish(self, seen: Seen, node: str, reserved: DeviceAllocations, extra: Mapping[str, str]) -> None:
        """The room's devices as `device-allocated`, then the status that says Available."""
        assert seen.res is not None
        annotations: dict[str, str | None] = {keys.DEVICE_ALLOCATED: reserved.to_json(), **extra}
        status = st.available(seen.res, node, seen.req, self.now)
        note = f"reserved on {node}: {st.describe(reserved)}"
        writes = (Annotate(seen.ref, annotations, seen.name), WriteStatus(seen.ref, status, seen.name))
        self.actions.append(
            WriteInOrder(seen.name, writes, Event(seen.ref, "Normal", "Reserved", note, ACTION), "")
        )

    # -- an Available one --------------------------------------------------------------------------

    def _upkeep(self, seen: Seen) -> None:
        res, room = seen.res, seen.room
        assert res is not None and room is not None
        if not seen.node_exists:
            note = f"node {room.node} is gone"
            self._finish(seen, st.failed(res, "NodeNotFound", note, self.now), "Failed", note)
            return
        if res.allocate_once and seen.bound:
            note = f"allocated to {seen.bound[0]} (allocateOnce)"
            self._finish(seen, st.succeeded(res, seen.owners, self.now), "Succeeded", note)
            return
        if not seen.bound and not seen.status.get("currentOwners"):
            return  # no owner yet, none recorded: nothing to write (the common case, cheaply)
        want = st.owners_status(seen.owners)
        if want != st.owners_of(seen.status):
            self.actions.append(WriteInOrder(seen.name, (WriteStatus(seen.ref, want, seen.name),)))

    def _publish_when_ready(self, seen: Seen) -> None:
        """A room held here but not written: written once its victims are gone (evicting again
        those a budget refused), or given up when they outstay the preemption timeout."""
        room = seen.room
        assert room is not None
        if room.victims:
            if room.left and self.now - room.held_since > self.settings.preemption_timeout:
                self._release(seen.name)
                self.actions.append(Requeue(seen.name))  # placed afresh
                return
            if room.left:
                for v in room.left:
                    if not v.deleting:
                        namespace, _, name = v.key.partition("/")
                        self.actions.append(Evict(ObjectRef(namespace, name, v.uid), v.node, seen.name))
                left = room.held_since + self.settings.preemption_timeout - self.now
                self.actions.append(Requeue(seen.name, max(0.0, left)))
                return
            self.door.victims_gone(seen.name)
        self._publish(seen, room.node, room.reserved, room.annotations)

    # -- placing -------------------------------------------------------------------------------------

    def _ours(self, res: rv.Reservation) -> bool:
        names = self.settings.scheduler_names
        spec = res.template.get("spec") or {}
        return not names or (spec.get("schedulerName") or "default-scheduler") in names

    def _place_gang(self, members: list[Seen], gang: GangSeen) -> None:
        first = members[0].res
        assert first is not None
        # Members already holding room (placed before one of the others was re-created) count.
        have = len(members) + gang.held
        if have < first.gang_size:
            note = f"waiting for the gang's other reservations: {have} of {first.gang_size} exist"
            for m in members:
                assert m.res is not None
                status = st.unschedulable(m.res, note, self.now, "GangIncomplete")
                self._say(m, status, "Normal", "GangWaiting", note)
            return
        self._place(members, gang)

    def _place(self, members: Sequence[Seen], gang: GangSeen | None = None) -> None:
        reqs = [m.request() for m in members]
        pool = set(self.door.admitting_nodes(members[0]))
        for m in members[1:]:
            pool &= set(self.door.admitting_nodes(m))
        names = sorted(pool)
        topology = GangTopology()
        profile = self.view.profile
        if gang is not None and profile is not None:
            try:
                topology = GangTopology(profile.keys, gang_levels(members, profile), dict(gang.holding))
            except CodecError as exc:
                note = f"topology: {exc}"
                for m in members:
                    assert m.res is not None
                    status = st.unschedulable(m.res, note, self.now, "InvalidTopology")
                    self._say(m, status, "Warning", "FailedReserve", note)
                return
        keys_ = [m.name for m in members]
        got = (
            self.door.place_one(keys_[0], reqs[0], names)
            if len(members) == 1 and topology.levels is None
            else self.door.place_gang(keys_, reqs, names, topology)
        )
        if not got.spots and self.settings.preemption and all(m.may_preempt for m in members):
            pre = self.door.with_preemption(keys_, reqs, names, topology)
            if pre.spots:
                got = pre
        if not got.spots:
            note = (
                got.message
                if len(members) == 1
                else f"the gang of {len(members)} does not fit: {got.message}"
            )
            for m in members:
                assert m.res is not None
                self._say(m, st.unschedulable(m.res, note, self.now), "Warning", "FailedReserve", note)
            return
        self._hold(members, got)

    def _hold(self, members: Sequence[Seen], got: Placing) -> None:
        by_name = {m.name: m for m in members}
        victims = tuple(v.key for v in got.victims)
        extra = {}
        for spot in got.spots:
            extra[spot.name] = st.numa_annotations(by_name[spot.name].req, spot.numa)
            self.door.hold_room(spot, victims, extra[spot.name])
        if not victims:
            for spot in got.spots:
                self._publish(by_name[spot.name], spot.node, spot.devices, extra[spot.name])
            return
        shown = ", ".join(victims[:5]) + (f" and {len(victims) - 5} more" if len(victims) > 5 else "")
        note = f"preempting {len(victims)} lower-priority pod(s) to make room: {shown}"
        for m in members:
            assert m.res is not None
            self._say(m, st.unschedulable(m.res, note, self.now, "Preempting"), "Normal", "Preempting", note)
            self.actions.append(Requeue(m.name, self.settings.preemption_timeout))
        for v in got.victims:
            namespace, _, name = v.key.partition("/")
            self.actions.append(Evict(ObjectRef(namespace, name, v.uid), v.node, members[0].name))

    # -- freed room ----------------------------------------------------------------------------------

    def _nudge(self) -> None:
        """Offer the freed room to the pods kube-scheduler holds back. A pod is nudged when the
        extender's own filter would now pass it on a freed node (rooms and their owners counted as
        at a real filter call): exact for what the allocator decides, and cheap, as only freed nodes
        are asked, and only for the first pods in kube-scheduler's queue order (higher priority,
        then older, as it would try them), so one big release never turns into a storm of writes."""
        if not self.freed or self.settings.nudges <= 0:
            return
        nodes = frozenset(self.freed)
        sent = 0
        for pod in self.door.waiting(self.settings.looked_at):
            node = self.door.fits(pod.ref.key, nodes)
            if not node:
                continue
            self.actions.append(Nudge(pod.ref, node))
            sent += 1
            if sent >= self.settings.nudges:
                return
