"""The Reservation controller (leader only): places Reservations and keeps their status.

Every pass (woken by the watch cache, batched, and at least every `resyncPeriod`) it looks at each
Reservation once, oldest first:
  * one that does not decode gets `Scheduled=False, reason Invalid` and the decoding error, and an
    Event; it is never placed and never crashes anything (fix the object and it is looked at anew);
  * one past its `expires` (or creation + `ttl`) gives its room back: phase Failed, `Ready=False,
    reason Expired`;
  * an Available one with allocateOnce whose owner is bound gives the rest back: phase Succeeded;
    its status keeps `currentOwners` and `allocated` in step with its owners; one whose node is gone
    fails;
  * a Pending one is placed with the same core as a pod (placing.py); a gang of them (the
    `topoalloc.io/reservation-gang` label) all at once or not at all, inside one domain of the
    topology level its members ask for (placing.py, docs/topology.md). The room is held in the
    ledger at once, then written: the reserved devices as `device-allocated`, then the status
    (Available, nodeName, allocatable). One that fits nowhere waits with `Scheduled=False, reason
    Unschedulable` and an Event, or, with a template priority, evicts the cheapest lower-priority
    pods (PodDisruptionBudgets hold) while its room waits for them.
A restarted or new leader finds every written room in the API (the book rebuilds it); a room held
but not yet written is placed afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from allocator.core.gang.victims import Candidate
from allocator.reservations import status as st
from allocator.reservations import writes
from allocator.reservations.book import Entry, RoomBook
from allocator.reservations.cache_view import ReservationCache
from allocator.reservations.placing import (
    GangTopology,
    Placing,
    admitting,
    gang_levels,
    place_gang,
    place_one,
    with_preemption,
)
from allocator.runtime.coreadapter import CoreAdapter, PodRequest
from allocator.runtime.events import EventSink, PodRef
from allocator.runtime.evictions import evict
from allocator.runtime.kube import KubeApi
from allocator.runtime.reservation_settings import ReservationSettings
from apis import reservation as rv
from apis.errors import CodecError
from apis.topology_profile import TopologyProfile

log = logging.getLogger(__name__)

Effect = Awaitable[None]


class ReservationController:
    def __init__(
        self,
        *,
        api: KubeApi,
        cache: ReservationCache,
        core: CoreAdapter,
        book: RoomBook,
        settings: ReservationSettings,
        events: EventSink,
        is_leader: Callable[[], bool],
        synced: Callable[[], bool],
        wall: Callable[[], float] = time.time,
        profile: Callable[[], TopologyProfile] | None = None,
    ) -> None:
        self.api = api
        # The allocator's topology profile (the gang scheduling's, docs/topology.md): gangs of
        # Reservations keep to its levels as gangs of pods do. None: no levels.
        self.profile = profile
        self.cache = cache
        self.core = core
        self.book = book
        self.settings = settings
        self.events = events
        self.is_leader = is_leader
        self.synced = synced
        self.wall = wall
        self.passes = 0
        self._wake = asyncio.Event()
        self._said: dict[str, str] = {}  # name -> the last condition written (no rewrite each pass)
        self._priorities: dict[str, int | None] = {}  # PriorityClass name -> value
        self._evicting: set[str] = set()
        self._last_full = float("-inf")

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.resync_period):
                    await self._wake.wait()
                await asyncio.sleep(self.settings.batch_delay)
            self._wake.clear()
            if not self.is_leader():
                self.step_down()
                continue
            if not self.synced():
                continue
            full = self.wall() - self._last_full >= self.settings.resync_period
            try:
                await self.reconcile(full=full)
            except Exception:  # a bug in one pass must not stop Reservations for good
                log.exception("reservation controller pass failed")

    def step_down(self) -> None:
        """Leadership lost: rooms held here but not written are the next leader's to place."""
        for entry in list(self.book.entries.values()):
            if entry.placed_here:
                self.book.release(entry.name)

    # -- a pass ------------------------------------------------------------------------------------

    async def reconcile(self, *, full: bool = True) -> None:
        """One pass: over every Reservation (`full`, at least every resync period: expiry, waiting
        ones tried again), else over those changed since the last pass and those held here but not
        yet written."""
        self.passes += 1
        now = self.wall()
        book = self.book
        changed, book.dirty = book.dirty, set()
        if full:
            self._last_full = now
            entries = list(book.entries.values())
        else:
            names = changed | book.unwritten
            gangs_changed = {e.res.gang for n in names if (e := book.entries.get(n)) and e.res and e.res.gang}
            if gangs_changed:  # a gang is placed whole: all its members
                names |= {
                    n for n, e in book.entries.items() if e.res is not None and e.res.gang in gangs_changed
                }
            entries = [e for n in names if (e := book.entries.get(n)) is not None]
        effects: list[Effect] = []
        waiting: list[Entry] = []
        gangs: dict[str, list[Entry]] = {}
        for entry in sorted(entries, key=_age):
            res = entry.res
            if res is None:
                effects.append(
                    self._say(entry, st.invalid(entry), "Warning", "InvalidReservation", entry.error)
                )
            elif res.deleting or res.phase in (rv.SUCCEEDED, rv.FAILED):
                continue
            elif res.expiry() <= now:
                effects.append(
                    self._finish(entry, st.expired(res, now), "Expired", "the reservation expired")
                )
            elif res.pre_allocation:
                note = "preAllocation is not supported by topoalloc; the reservation is not placed"
                effects.append(
                    self._say(
                        entry, st.unschedulable(res, note, "Unsupported"), "Warning", "FailedReserve", note
                    )
                )
            elif entry.room is not None and res.phase == rv.AVAILABLE:
                effects.extend(self._upkeep(entry, now))
            elif entry.room is not None and entry.placed_here:
                effects.extend(self._publish_when_ready(entry, now))
            elif not self._ours(res):
                continue  # another scheduler's to place
            elif res.gang:
                gangs.setdefault(res.gang, []).append(entry)
            else:
                waiting.append(entry)
        for entry in waiting:
            effects.extend(await self._place([entry]))
        for gang, members in sorted(gangs.items()):
            size = members[0].res.gang_size if members[0].res else 1
            # Members already holding room (placed before one of the others was re-created) count.
            held = sum(
                1 for e in book.entries.values() if e.room is not None and e.res and e.res.gang == gang
            )
            if len(members) + held < size:
                note = f"waiting for the gang's other reservations: {len(members) + held} of {size} exist"
                for m in members:
                    assert m.res is not None
                    effects.append(
                        self._say(
                            m, st.unschedulable(m.res, note, "GangIncomplete"), "Normal", "GangWaiting", note
                        )
                    )
                continue
            effects.extend(await self._place(members))
        if effects:
            await asyncio.gather(*effects)

    # -- placing -------------------------------------------------------------------------------------

    async def _place(self, members: list[Entry]) -> list[Effect]:
        reqs = [await self._request(m) for m in members]
        names = set(admitting(self.cache, self.core, members[0]))
        for m in members[1:]:
            names &= set(admitting(self.cache, self.core, m))
        pool = sorted(names)
        topology = GangTopology()
        if members[0].res is not None and members[0].res.gang and self.profile is not None:
            try:
                topology = self._topology(members, self.profile())
            except CodecError as exc:
                note = f"topology: {exc}"
                return [
                    self._say(
                        m, st.unschedulable(m.res, note, "InvalidTopology"), "Warning", "FailedReserve", note
                    )
                    for m in members
                    if m.res is not None
                ]
        got = (
            place_one(self.core, members[0], reqs[0], pool)
            if len(members) == 1 and topology.levels is None
            else place_gang(self.core, members, reqs, pool, topology)
        )
        if not got.spots and self.settings.preemption and all(self._may_preempt(m) for m in members):
            pre = with_preemption(self.cache, self.core, members, reqs, pool, topology)
            if pre.spots:
                got = pre
        if not got.spots:
            effects = []
            for m in members:
                assert m.res is not None
                note = (
                    got.message
                    if len(members) == 1
                    else f"the gang of {len(members)} does not fit: {got.message}"
                )
                effects.append(self._say(m, st.unschedulable(m.res, note), "Warning", "FailedReserve", note))
            return effects
        return self._hold(members, got)

    def _hold(self, members: list[Entry], got: Placing) -> list[Effect]:
        by_name = {m.name: m for m in members}
        victims = tuple(v.key for v in got.victims)
        effects: list[Effect] = []
        for spot in got.spots:
            entry = by_name[spot.name]
            self.book.hold(spot.name, spot.node, spot.devices, numa=spot.numa)
            entry.placed_here = True
            self.book.unwritten.add(spot.name)
            entry.victims = victims
            entry.extra = st.numa_annotations(entry, spot.numa)
        if victims:
            names = ", ".join(victims[:5]) + (f" and {len(victims) - 5} more" if len(victims) > 5 else "")
            note = f"preempting {len(victims)} lower-priority pod(s) to make room: {names}"
            for m in members:
                assert m.res is not None
                effects.append(
                    self._say(m, st.unschedulable(m.res, note, "Preempting"), "Normal", "Preempting", note)
                )
            effects.extend(self._evict(v) for v in got.victims if v.key not in self._evicting)
            return effects
        return [self._publish(by_name[s.name]) for s in got.spots]

    async def _evict(self, victim: Candidate) -> None:
        self._evicting.add(victim.key)
        try:
            why = await evict(self.api, victim)
        finally:
            self._evicting.discard(victim.key)
        if why:
            log.info("evicting %s for a reservation: %s (tried again next pass)", victim.key, why)

    def _publish_when_ready(self, entry: Entry, now: float) -> list[Effect]:
        """A room held here but not written: written once its victims are gone (evicting again
        those a budget refused), or given up when they outstay `preemptionTimeout`."""
        if entry.victims:
            left = [k for k in entry.victims if self._still_there(k)]
            if left and now - entry.held_since > self.settings.preemption_timeout:
                self.book.release(entry.name)
                return []
            if left:
                pods = self.cache.pods
                return [
                    self._evict(Candidate(k, pods[k].node, pods[k].priority, pods[k].gang, pods[k].uid))
                    for k in left
                    if k not in self._evicting and not pods[k].deleting
                ]
            entry.victims = ()
        return [self._publish(entry)]

    def _still_there(self, key: str) -> bool:
        pod = self.cache.pods.get(key)
        return pod is not None and pod.holds

    async def _publish(self, entry: Entry) -> None:
        room, res = entry.room, entry.res
        if room is None or res is None:
            return
        annotations: dict[str, str | None] = {st.DEVICE_ALLOCATED: room.reserved.to_json(), **entry.extra}
        if not await writes.annotate(self.api, entry.name, res.uid, annotations):
            return
        status = st.available(res, room.node, entry.req, self.wall())
        if await writes.patch_status(self.api, entry.name, res.uid, status):
            self._said.pop(entry.name, None)
            self._event(entry, "Normal", "Reserved", f"reserved on {room.node}: {st.describe(room.reserved)}")

    # -- upkeep of an Available one -------------------------------------------------------------------

    def _upkeep(self, entry: Entry, now: float) -> list[Effect]:
        res, room = entry.res, entry.room
        assert res is not None and room is not None
        if room.node not in self.cache.nodes:
            return [
                self._finish(
                    entry,
                    st.failed(res, "NodeNotFound", f"node {room.node} is gone", now),
                    "Failed",
                    f"node {room.node} is gone",
                )
            ]
        bound = sorted(self.book.consumers.get(entry.name, ()))
        if res.allocate_once and bound:
            return [
                self._finish(
                    entry,
                    st.succeeded(res, self.cache.pods, bound, now),
                    "Succeeded",
                    f"allocated to {bound[0]} (allocateOnce)",
                )
            ]
        if not bound and not (entry.raw.get("status") or {}).get("currentOwners"):
            return []  # no owner yet, none recorded: nothing to write (the common case, cheaply)
        want = st.owners_status(self.cache.pods, bound)
        if want != st.owners_of(entry.raw):
            return [self._write(entry, want)]
        return []

    async def _finish(self, entry: Entry, status: dict[str, Any], reason: str, note: str) -> None:
        res = entry.res
        assert res is not None
        self.book.release(entry.name)
        if await writes.patch_status(self.api, entry.name, res.uid, status):
            self._event(entry, "Normal" if reason != "Failed" else "Warning", f"Reservation{reason}", note)

    async def _write(self, entry: Entry, status: dict[str, Any]) -> None:
        res = entry.res
        assert res is not None
        await writes.patch_status(self.api, entry.name, res.uid, status)

    async def _say(self, entry: Entry, status: dict[str, Any], type_: str, reason: str, note: str) -> None:
        """A condition written (and an Event recorded) only when it says something new."""
        if self._said.get(entry.name) == note:
            return
        if await writes.patch_status(self.api, entry.name, entry.uid, status):
            self._said[entry.name] = note
            self._event(entry, type_, reason, note)

    def _event(self, entry: Entry, type_: str, reason: str, note: str) -> None:
        self.events.record(
            PodRef("", entry.name, entry.uid, rv.KIND, rv.API_VERSION), type_, reason, "Reserve", note
        )

    def _topology(self, members: list[Entry], profile: TopologyProfile) -> GangTopology:
        """A gang's level, and the nodes of its members already holding room (their domain then
        bounds a required level)."""
        gang = members[0].res.gang if members[0].res is not None else ""
        siblings: dict[str, int] = {}
        for e in self.book.entries.values():
            if e.room is not None and e.res is not None and e.res.gang == gang:
                siblings[e.room.node] = siblings.get(e.room.node, 0) + 1
        return GangTopology(profile.keys, gang_levels(members, profile), siblings)

    # -- priorities -------------------------------------------------------------------------------------

    async def _request(self, entry: Entry) -> PodRequest:
        """The template's request with its priority (a priorityClassName read from the API)."""
        req = entry.req
        assert req is not None and entry.res is not None
        spec = entry.res.template.get("spec") or {}
        name = spec.get("priorityClassName") if spec.get("priority") is None else None
        if not name:
            return req
        if name not in self._priorities:
            self._priorities[name] = await writes.priority_value(self.api, name)
        value = self._priorities[name]
        return req if value is None else replace(req, priority=value)

    def _ours(self, res: rv.Reservation) -> bool:
        names = self.settings.scheduler_names
        spec = res.template.get("spec") or {}
        return not names or (spec.get("schedulerName") or "default-scheduler") in names

    def _may_preempt(self, entry: Entry) -> bool:
        spec = (entry.res.template.get("spec") if entry.res else None) or {}
        has_priority = (
            spec.get("priority") is not None
            or self._priorities.get(spec.get("priorityClassName") or "") is not None
        )
        return has_priority and spec.get("preemptionPolicy") != "Never"


def _age(entry: Entry) -> tuple[float, str]:
    created = entry.res.created if entry.res is not None else None
    return (created if created is not None else 0.0, entry.name)
