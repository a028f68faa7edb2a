"""The gang controller (leader only): plans each gang as a whole and lets its members go only then.

Every pass (woken by the watch cache, batched, and at least every `resyncPeriod`), per gang:

1. Members are the pods naming the gang (PodGroup label, legacy label, Koordinator annotations)
   for a scheduler we serve; its size is the PodGroup's minMember or Koordinator's min-available,
   its timeout scheduleTimeoutSeconds or Koordinator's waiting-time (else `defaultTimeout`).
2. A plan whose member left before it was bound (deleted, re-created, finished) is released whole
   and made again; so is a plan whose members were not bound within `bindTimeout`.
3. With at least minMember members, fewer than minMember of them bound or planned: plan every
   member not yet bound at once (the core's `plan_gang`); if they do not all fit, just enough of
   them to reach minMember. Found: reserve every placement in the cache, then remove the members'
   gates. Not found: the members stay gated and hold nothing, the PodGroup status says
   PreScheduling and Events say why (also on the members: member_events.py); so does a PodGroup
   whose minResources cannot be met, unplanned. Past the timeout: phase Failed, an Event, and the
   gang is not planned again until its members are replaced.
4. Members beyond minMember of a gang that has its minimum are planned one by one, near their
   siblings.
5. The PodGroup status follows: phase, scheduled, running, succeeded, failed, scheduleStartTime.

Waiting gangs are planned by priority (their lowest member's), then oldest first. Plans live in
this process only (here and as the cache's holds, gang/holds.py). A new leader, or a restarted
allocator, starts without them: gated members are planned afresh, members already released but
not bound are held by the extender's filter until planned again, bound members count as placed.
No member is bound against an older plan.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from allocator.core.gang.plan import GangPlan, NoPlan, PlanSettings
from allocator.core.gang.priority import gang_priority, queue_key
from allocator.core.request.pod_request import PodRequest
from allocator.gang.cache_view import GangCache
from allocator.gang.controller_state import Decision, Gang, GangState, Planned
from allocator.gang.holds import PlanHolds
from allocator.gang.index import GangIndex, MemberPod
from allocator.gang.member_events import MemberEvents
from allocator.gang.metrics import GangMetrics
from allocator.gang.plan_inputs import admitting_nodes, gang_view, member_requests, sibling_nodes
from allocator.gang.podgroup_status import status_update
from allocator.gang.preempting import GangPreemptor, shortage_code
from allocator.gang.writes import annotate_planned_node, patch_podgroup_status, remove_gate, report_event
from allocator.runtime.cache.records import Reservation
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.events import EventSink, PodRef
from allocator.runtime.gang_settings import GangSettings
from allocator.runtime.kube import KubeApi
from apis import keys
from apis.timestamps import parse_time

log = logging.getLogger(__name__)

JSON = dict[str, Any]
Effect = Awaitable[None]


class GangController:
    def __init__(
        self,
        *,
        api: KubeApi,
        cache: GangCache,
        core: CoreAdapter,
        holds: PlanHolds,
        index: GangIndex,
        settings: GangSettings,
        metrics: GangMetrics,
        events: EventSink,
        is_leader: Callable[[], bool],
        synced: Callable[[], bool],
        plan_settings: PlanSettings,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.cache = cache
        self.core = core
        self.holds = holds
        self.index = index
        self.settings = settings
        self.metrics = metrics
        self.events = events
        self.is_leader = is_leader
        self.synced = synced
        self.plan_settings = plan_settings
        self.clock = clock
        self.wall = wall
        self.member_events = MemberEvents(events, clock)
        self.preemptor = GangPreemptor(api, cache, core, metrics, settings, plan_settings, clock)
        self.states: dict[str, GangState] = {}
        self.passes = 0
        self._wake = asyncio.Event()
        self._next_deadline = math.inf  # wall clock: the next timeout or bind deadline to look at
        self._ungating: dict[str, str] = {}  # pod key -> uid of a gate removal sent or in flight
        self._leading = False
        self._head_open = True  # no waiting gang seen yet in this pass (starvation goes to the first)

    # -- loop ------------------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            wait = min(self.settings.resync_period, max(0.0, self._next_deadline - self.wall()))
            try:
                async with asyncio.timeout(wait):
                    await self._wake.wait()
                await asyncio.sleep(self.settings.batch_delay)  # let a burst of events land
            except TimeoutError:
                pass
            self._wake.clear()
            if not (self.is_leader() and self.synced()):
                if self._leading:
                    self.step_down()
                continue
            self._leading = True
            try:
                await self.reconcile_all()
            except Exception:  # a bug in one pass must not stop gang scheduling for good
                log.exception("gang controller pass failed")

    def step_down(self) -> None:
        """Leadership lost: the next leader plans from scratch, so hold nothing here."""
        for state in self.states.values():
            for key in state.plan:
                self.holds.release(key, force=True)
        self.states.clear()
        self._ungating.clear()
        self._leading = False

    async def reconcile_all(self) -> None:
        self.passes += 1
        self._head_open = True
        self._next_deadline = math.inf
        gangs = [self._view(key) for key in sorted(set(self.index.by_gang) | set(self.states))]
        gangs.sort(key=self._queue_order)
        effects: list[Effect] = []
        waiting = 0
        for gang in gangs:
            effects.extend(self._reconcile(gang))
            if not gang.members:  # written back to Pending if it had failed; forget it now
                self._release(self.states.pop(gang.key))
                continue
            state = self.states.get(gang.key)
            planned = state.plan if state is not None else {}
            waiting += sum(1 for m in gang.active if not m.node and m.key not in planned)
        self.metrics.waiting.set(waiting)
        self.metrics.observe_pass(*self.preemptor.pass_summary(self.states))
        for key in [k for k in self._ungating if k not in self.index.pods]:
            del self._ungating[key]
        effects.extend(self.preemptor.drain())
        if effects:
            await asyncio.gather(*effects)

    def _queue_order(self, gang: Gang) -> tuple[object, ...]:
        """Higher priority first (the lowest of its members'), then the earliest to have its
        minimum of members (core/gang/priority.py)."""
        state = self.states.get(gang.key)
        start = self._start(gang, state) if state is not None else None
        priority = gang_priority(m.priority for m in gang.active)
        return queue_key(priority, start if start is not None else math.inf, gang.key)

    # -- one gang ----------------------------------------------------------------------------------

    def _view(self, key: str) -> Gang:
        return gang_view(self.index, self.cache, self.settings, key)

    def _start(self, gang: Gang, state: GangState) -> float | None:
        """Wall-clock time the gang first had its minimum of members (None: not yet)."""
        active = gang.active
        if len(active) < gang.min_member:
            return None
        if gang.podgroup is None:
            # Koordinator gangs keep no status: the creation of the member that completed the
            # minimum is a time every allocator instance reads the same way.
            return parse_time(active[gang.min_member - 1].created)
        if state.start is None:
            recorded = self._status(gang, state).get("scheduleStartTime")
            state.start = parse_time(recorded) if isinstance(recorded, str) else None
            if state.start is None:
                state.start = self.wall()
        return state.start

    def _reconcile(self, gang: Gang) -> list[Effect]:
        state = self.states.setdefault(gang.key, GangState())
        effects: list[Effect] = []
        self._check_plan(gang, state)
        active = gang.active
        bound = [m for m in active if m.node]
        pending = [m for m in active if not m.node]
        scheduled = sum(1 for m in gang.members if m.node)
        if state.done is None:
            state.done = scheduled >= gang.min_member  # done before we looked: nothing to time
        failed = self._failed(gang, state)
        if failed and not active:
            # Every member is gone: the next ones start afresh (the status still says Failed, so
            # it gets written back to Pending).
            failed = False
            state = self.states[gang.key] = GangState(done=False)
            state.status = {"phase": "Failed"} if gang.podgroup is not None else None
        start = self._start(gang, state)
        if gang.problem:
            state.reason, state.wait_code = gang.problem, "InvalidPodGroup"
        elif failed:
            pass
        elif len(active) < gang.min_member:
            state.reason = f"waiting for members: the gang needs at least {gang.min_member}"
            state.wait_code = "WaitingForMembers"
        elif len(bound) + len(state.plan) < gang.min_member:
            if gang.timeout and start is not None and self.wall() - start >= gang.timeout:
                self._fail(gang, state)
                failed = True
            else:
                self._plan(gang, state, bound, pending)
                if gang.timeout and start is not None and not state.plan:
                    self._next_deadline = min(self._next_deadline, start + gang.timeout)
        else:
            state.reason = ""
            self._plan_late(gang, state, pending)
        if state.plan:
            left = state.planned_at + self.settings.bind_timeout - self.clock()
            self._next_deadline = min(self._next_deadline, self.wall() + max(0.0, left))
        if not state.done and scheduled >= gang.min_member:
            state.done = True
            if start is not None:
                self.metrics.duration.observe(max(0.0, self.wall() - start))
            self._report(
                gang,
                state,
                "GangScheduled",
                f"{scheduled} of {len(gang.members)} members are bound",
                "Normal",
            )
        elif state.reason and not failed:
            self._report(gang, state, "GangWaiting", state.reason)
        effects += self._advance_preemption(gang, state)
        effects += self._release_gates(gang, state)
        if gang.podgroup is not None:
            self.member_events.tell(gang, state)
            effects += self._write_status(gang, state, failed, start)
        return effects

    def _check_plan(self, gang: Gang, state: GangState) -> None:
        """Drop members the plan did its job for; release the whole plan when one left before it
        was bound or the plan outlived `bindTimeout`."""
        by_key = {m.key: m for m in gang.members}
        lost = []
        for key, planned in list(state.plan.items()):
            m = by_key.get(key)
            if m is not None and m.uid == planned.uid and m.node:
                del state.plan[key]  # bound: its pod holds the devices now
                continue
            res = self.cache.ledger.reservations.get(key)
            if m is None or m.uid != planned.uid or not m.active or res is None or res.uid != planned.uid:
                lost.append(key)
        if lost:
            self._release(state)
            note = (
                f"member {', '.join(sorted(lost))} left before it was bound: the gang's reservations "
                "are released and it is planned again"
            )
            self._report(gang, state, "GangPlanReleased", note, force=True)
            return
        late = self.clock() - state.planned_at > self.settings.bind_timeout
        if state.plan and not state.preempting and late:
            self._release(state, force=True)
            note = (
                f"planned members were not bound within {self.settings.bind_timeout:g}s (is kube-scheduler "
                "calling the topoalloc extender for them?): the reservations are released and it is "
                "planned again"
            )
            self._report(gang, state, "GangPlanReleased", note, force=True)

    def _release(self, state: GangState, *, force: bool = False) -> None:
        self.preemptor.forget(state)  # its hold records, if any
        for key in state.plan:
            self.holds.release(key, force=force)
        state.plan = {}
        state.attempt = None
        state.preempting = None

    def _failed(self, gang: Gang, state: GangState) -> bool:
        """A PodGroup keeps Failed in its status. A gang without one failed when we said so; after
        a restart its timeout (counted from creation times) fails it again at once."""
        if gang.podgroup is not None:
            return self._status(gang, state).get("phase") == "Failed"
        return state.failed_reported

    def _fail(self, gang: Gang, state: GangState) -> None:
        self._release(state)
        why = state.reason or "no placement found"
        state.reason = ""
        if state.failed_reported:
            return
        state.failed_reported = True
        self.metrics.timeouts.inc()
        note = f"no placement for the whole gang within its {gang.timeout:g}s timeout: {why}"
        self._report(gang, state, "GangFailed", note, force=True)

    # -- planning ----------------------------------------------------------------------------------

    def _plan(self, gang: Gang, state: GangState, bound: list[MemberPod], pending: list[MemberPod]) -> None:
        unplanned = [m for m in pending if m.key not in state.plan]
        # Higher priority first, then oldest: who goes first when only the minimum fits.
        ready = sorted((m for m in unplanned if not m.other_gates), key=lambda m: -m.priority)
        need = gang.min_member - len(bound) - len(state.plan)
        if len(ready) < need:
            blocked = Counter(g for m in unplanned for g in m.other_gates)
            state.reason = (
                f"{len(unplanned) - len(ready)} member(s) wait for other scheduling gates: "
                + ", ".join(sorted(blocked))
            )
            state.wait_code = "OtherSchedulingGates"
            return
        head, self._head_open = self._head_open, False  # the first gang in queue order to wait
        starving = self.preemptor.starving(head, self._start(gang, state), self.wall())
        seen = (tuple((m.key, m.uid) for m in ready), len(bound), self.index.generation, starving)
        if state.attempt == seen:
            return  # nothing changed since the last attempt found no room
        requests = member_requests(self.cache, self.core, ready)
        if len(requests) < need:
            return  # the cache has not caught up with a member yet
        restored = self.preemptor.restore(state, ready, lambda p: self._commit(gang, state, p, ready))
        if restored is not None:  # a hold recorded by an earlier leader (gang/hold_record.py)
            return self._report(gang, state, *restored)
        names = admitting_nodes(self.cache, self.core, ready)
        if gang.podgroup is not None and gang.podgroup.min_resources:
            removable = self.preemptor.removable(requests[:need], starving)
            short = self.core.min_resources_shortage(gang.podgroup.min_resources, names, removable)
            if short is not None:  # no plan can exist: do not search
                state.attempt, state.reason, state.wait_code = seen, short.message, "InsufficientResources"
                self.metrics.plans.labels("no_room").inc()
                return
        siblings = sibling_nodes(self.core, self.index, gang.key, ready)
        found = self.core.plan_gang(requests, self.plan_settings, siblings=siblings, names=names)
        if isinstance(found, NoPlan) and len(requests) > need:
            fewer = self.core.plan_gang(requests[:need], self.plan_settings, siblings=siblings, names=names)
            found = fewer if isinstance(fewer, GangPlan) else found
        if isinstance(found, NoPlan) and self._make_room(gang, state, ready, requests, names, starving):
            return
        if isinstance(found, NoPlan):
            state.attempt = seen
            state.reason = f"no placement for {need} more member(s) at once: {found.message}"
            state.wait_code = shortage_code(requests[:need], self.core.whole_gpus_free(names))
            self.metrics.plans.labels("no_room").inc()
            return
        if not self._commit(gang, state, found, ready):
            return
        self.metrics.plans.labels("planned").inc()
        state.reason = ""
        where = ", ".join(found.nodes) + (f" ({found.domain})" if found.domain else "")
        note = f"planned {len(found.placements)} member(s) on {where}; releasing them"
        self._report(gang, state, "GangPlanned", note, "Normal")

    def _make_room(
        self,
        gang: Gang,
        state: GangState,
        ready: list[MemberPod],
        requests: list[PodRequest],
        names: list[str],
        starving: bool,
    ) -> bool:
        """Evict lower-priority pods, or (starving) hold the room others free; see preempting.py."""
        siblings = sibling_nodes(self.core, self.index, gang.key, ready)
        report = self.preemptor.make_room(
            state, ready, requests, names, siblings, starving, lambda p: self._commit(gang, state, p, ready)
        )
        if report is not None:
            self._report(gang, state, *report)
        return report is not None

    def _advance_preemption(self, gang: Gang, state: GangState) -> list[Effect]:
        effects, report = self.preemptor.advance(state, lambda: self._release(state, force=True))
        if report is not None:
            reason, note, type_ = report
            self._report(gang, state, reason, note, type_, force=reason != "GangPlanned")
        return effects

    def _plan_late(self, gang: Gang, state: GangState, pending: list[MemberPod]) -> None:
        """Members beyond the minimum, one at a time (higher priority first): the gang already runs
        without them."""
        for m in sorted(pending, key=lambda m: -m.priority):
            if m.key in state.plan or m.other_gates:
                continue
            requests = member_requests(self.cache, self.core, [m])
            if not requests:
                continue
            found = self.core.plan_gang(
                requests,
                self.plan_settings,
                siblings=sibling_nodes(self.core, self.index, gang.key, [m]),
                names=admitting_nodes(self.cache, self.core, [m]),
            )
            if isinstance(found, GangPlan) and self._commit(gang, state, found, [m]):
                continue
            if isinstance(found, NoPlan) and m.key not in state.told:
                state.told.add(m.key)
                self.events.warn(
                    PodRef(m.namespace, m.name, m.uid), "GangWaiting", "Scheduling", found.message
                )

    def _commit(self, gang: Gang, state: GangState, plan: GangPlan, members: list[MemberPod]) -> bool:
        """Reserve every placement, or none."""
        by_key = {m.key: m for m in members}
        made = []
        for placement in plan.placements:
            m = by_key[placement.key]
            entry = self.cache.pods[m.key]
            req = self.core.request(entry.raw or {})
            got = self.holds.reserve(
                m.key, m.uid, placement.node, placement.allocation.devices, req, gang.key
            )
            if not isinstance(got, Reservation):
                for key in made:
                    self.holds.release(key)
                log.warning("gang %s: reserving %s failed: %s", gang.key, m.key, got)
                return False
            made.append(m.key)
        for placement in plan.placements:
            state.plan[placement.key] = Planned(by_key[placement.key].uid, placement.node)
        state.planned_at = self.clock()
        state.attempt = None
        return True

    # -- writes ------------------------------------------------------------------------------------

    def _release_gates(self, gang: Gang, state: GangState) -> list[Effect]:
        effects: list[Effect] = []
        if state.preempting is not None:
            return effects  # the room is not free yet
        for m in gang.members:
            planned = state.plan.get(m.key)
            if planned is None or m.node:
                continue
            if m.gated:
                if self._ungating.get(m.key) != m.uid:
                    self._ungating[m.key] = m.uid
                    effects.append(self._remove_gate(m))
            elif (
                m.annotations.get(keys.GANG_PLANNED_NODE) != planned.node
                and state.nudged.get(m.key) != planned.node
            ):
                # Released earlier (by us before a restart, or never gated): kube-scheduler parked
                # it after our filter refused it; an update to the pod brings it back at once.
                state.nudged[m.key] = planned.node
                effects.append(annotate_planned_node(self.api, m, planned.node))
        return effects

    def _status(self, gang: Gang, state: GangState) -> JSON:
        """The PodGroup status as we last wrote it, else as the cache has it."""
        if state.status is not None:
            return state.status
        return gang.podgroup.status.to_dict() if gang.podgroup is not None else {}

    def _write_status(self, gang: Gang, state: GangState, failed: bool, start: float | None) -> list[Effect]:
        status = status_update(gang, state, failed, start, self._status(gang, state), self.wall())
        if status is None:
            return []
        state.status = {k: v for k, v in status.items() if v}
        return [self._patch_status(gang, status)]

    async def _remove_gate(self, m: MemberPod) -> None:
        if not await remove_gate(self.api, m):
            # The next pass sees the pod as it is now and tries again (or finds it gone).
            self._ungating.pop(m.key, None)

    async def _patch_status(self, gang: Gang, status: JSON) -> None:
        if not await patch_podgroup_status(self.api, gang.namespace, gang.name, status):
            state = self.states.get(gang.key)
            if state is not None:
                state.status = None  # write it again next pass

    def _report(
        self,
        gang: Gang,
        state: GangState,
        reason: str,
        note: str,
        type_: str = "Warning",
        *,
        force: bool = False,
    ) -> None:
        """An Event once per distinct note (writes.report_event)."""
        if gang.podgroup is not None:
            code = state.wait_code if reason == "GangWaiting" else ""
            state.decision = Decision(reason, code, type_, note)  # told to the members (member_events.py)
        if note != state.reported or force:
            state.reported = note
            report_event(self.events, gang, type_, reason, note)
