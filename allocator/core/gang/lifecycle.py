"""The gang lifecycle: one pure step per gang and pass, deciding; the caller acts (allocator/gang).

    step(gang, state, now, planner, settings=..., head=...) -> Step(state, actions, queued)

`gang` is the view of one gang (view.py), `state` what the lifecycle remembers of it (None the
first time), `now` the clocks' values, `planner` the door to the cluster (planner.py). The step
never changes the state it is given and does no I/O: it returns the gang's new state and the
actions to carry out (actions.py: the shared vocabulary and the gang's own), having handed the
hold ledger's changes to the planner as they happened. Per gang:

1. A plan whose member left before it was bound (deleted, re-created, finished) is released whole
   and made again; so is a plan whose members were not bound within `bind_timeout`.
2. With at least minMember members, fewer than minMember of them bound or planned: plan every
   member not yet bound at once (the planner's `plan_gang`); if they do not all fit, just enough
   of them to reach minMember. Found: reserve every placement, then ungate the members. Not
   found: the members stay gated and hold nothing, the PodGroup status says PreScheduling and
   Events say why (the members are told too); so does a PodGroup whose minResources cannot be
   met, unplanned. No room even so: preempt, or hold room for a starving gang (making_room.py).
   Past the timeout: phase Failed, an Event, and the gang is not planned again until its members
   are replaced.
3. Members beyond minMember of a gang that has its minimum are planned one by one, near their
   siblings.
4. The PodGroup status follows: phase, counts, scheduleStartTime, conditions (podgroup_status.py).

A pass steps through every gang in queue order (gang_pass.py, queueing.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, NamedTuple

from allocator.core.actions import Count, Event, Nudge, Observe, Requeue, Ungate, WriteStatus
from allocator.core.gang.actions import (
    DURATION,
    Action,
    ClearHold,
    Hold,
    HoldPlan,
    ReleaseHolds,
    TellMembers,
    member_ref,
    object_ref,
)
from allocator.core.gang.gang_state import Decision, GangState, Planned
from allocator.core.gang.making_room import RoomMaking, fold_evictions, shortage_code, starving
from allocator.core.gang.plan import GangPlan, NoPlan
from allocator.core.gang.planner import LifecycleSettings, Planner
from allocator.core.gang.podgroup_status import status_update
from allocator.core.gang.queueing import recorded_status, start_of
from allocator.core.gang.view import Clocks, Gang, MemberPod
from apis import keys

JSON = dict[str, Any]


class Step(NamedTuple):
    state: GangState
    actions: list[Action]
    queued: bool  # the gang waited for a placement this pass (so the starvation head was its)


def step(
    gang: Gang,
    state: GangState | None,
    now: Clocks,
    planner: Planner,
    *,
    settings: LifecycleSettings,
    head: bool = True,
) -> Step:
    """One gang's step. `head`: no gang before it in queue order waited for a placement this pass
    (the starvation bound applies to the first waiting gang only)."""
    turn = _Turn(gang, state.copy() if state is not None else GangState(), now, planner, settings, head)
    turn.run()
    return Step(turn.state, turn.actions, turn.queued)


def release_all(states: Iterable[GangState]) -> ReleaseHolds:
    """Leadership lost: the next leader plans from scratch (or continues the recorded holds), so
    nothing stays held here."""
    return ReleaseHolds(tuple(key for state in states for key in state.plan), force=True)


def let_go(state: GangState, planner: Planner, actions: list[Action], *, force: bool = False) -> None:
    """Release the gang's plan: its hold records and its holds."""
    if state.record:
        actions.extend(ClearHold(key, planned.uid) for key, planned in state.plan.items())
    state.record = ""
    if state.plan:
        planner.release(ReleaseHolds(tuple(state.plan), force=force))
    state.plan = {}
    state.attempt = None
    state.preempting = None


class _Turn:
    """One gang's step (the controller's old per-gang methods, deciding only)."""

    def __init__(
        self,
        gang: Gang,
        state: GangState,
        now: Clocks,
        planner: Planner,
        settings: LifecycleSettings,
        head: bool,
    ) -> None:
        self.gang = gang
        self.state = state
        self.now = now
        self.planner = planner
        self.settings = settings
        self.head = head
        self.queued = False
        self.actions: list[Action] = []
        self.room = RoomMaking(gang.key, planner, settings, now, self.actions, gang.levels)

    def run(self) -> None:
        gang = self.gang
        self._take_outcomes()
        self._check_plan()
        state = self.state
        active = gang.active
        bound = [m for m in active if m.node]
        pending = [m for m in active if not m.node]
        scheduled = sum(1 for m in gang.members if m.node)
        if state.done is None:
            state.done = scheduled >= gang.min_member  # done before we looked: nothing to time
        failed = self._failed()
        if failed and not active:
            # Every member is gone: the next ones start afresh (the status still says Failed, so
            # it gets written back to Pending).
            failed = False
            state = self.state = GangState(done=False)
            state.status = {"phase": "Failed"} if gang.keeps_status else None
        start = self._start()
        if gang.problem:
            state.reason, state.wait_code = gang.problem, gang.problem_code
        elif failed:
            pass
        elif len(active) < gang.min_member:
            state.reason = f"waiting for members: the gang needs at least {gang.min_member}"
            state.wait_code = "WaitingForMembers"
        elif len(bound) + len(state.plan) < gang.min_member:
            if gang.timeout and start is not None and self.now.wall - start >= gang.timeout:
                self._fail()
                failed = True
            else:
                self._plan(bound, pending, start)
                if gang.timeout and start is not None and not state.plan:
                    self._requeue_at(start + gang.timeout)
        else:
            state.reason = ""
            self._plan_late(pending)
        if state.plan:
            left = state.planned_at + self.settings.bind_timeout - self.now.mono
            self.actions.append(Requeue(gang.key, max(0.0, left)))
        if not state.done and scheduled >= gang.min_member:
            state.done = True
            if start is not None:
                self.actions.append(Observe(DURATION, max(0.0, self.now.wall - start)))
            self._report("GangScheduled", f"{scheduled} of {len(gang.members)} members are bound", "Normal")
        elif state.reason and not failed:
            self._report("GangWaiting", state.reason)
        self._advance_preemption()
        self._release_gates()
        if gang.api_object is not None:
            self.actions.append(TellMembers(gang, state))
        if gang.keeps_status:
            self._write_status(failed, start)

    # -- what happened since the last step -----------------------------------------------------

    def _take_outcomes(self) -> None:
        state, outcomes = self.state, self.gang.outcomes
        if outcomes.status_refused:
            state.status = None  # write it again
        for key in outcomes.gates_refused:
            state.ungating.pop(key, None)  # try again (or find it gone)
        fold_evictions(state.preempting, outcomes.evictions)
        members = {m.key for m in self.gang.members}
        state.ungating = {k: uid for k, uid in state.ungating.items() if k in members}

    def _check_plan(self) -> None:
        """Drop members the plan did its job for; release the whole plan when one left before it
        was bound or the plan outlived `bind_timeout`."""
        state = self.state
        by_key = {m.key: m for m in self.gang.members}
        lost = []
        for key, planned in list(state.plan.items()):
            m = by_key.get(key)
            if m is not None and m.uid == planned.uid and m.node:
                del state.plan[key]  # bound: its pod holds the devices now
                continue
            held = self.gang.holds.get(key)
            if m is None or m.uid != planned.uid or not m.active or held != planned.uid:
                lost.append(key)
        if lost:
            self._release()
            note = (
                f"member {', '.join(sorted(lost))} left before it was bound: the gang's reservations "
                "are released and it is planned again"
            )
            self._report("GangPlanReleased", note, force=True)
            return
        late = self.now.mono - state.planned_at > self.settings.bind_timeout
        if state.plan and not state.preempting and late:
            self._release(force=True)
            note = (
                f"planned members were not bound within {self.settings.bind_timeout:g}s (is kube-scheduler "
                "calling the topoalloc extender for them?): the reservations are released and it is "
                "planned again"
            )
            self._report("GangPlanReleased", note, force=True)

    def _requeue_at(self, wall: float) -> None:
        """Look at the gang again by the wall-clock time `wall` (a timeout)."""
        self.actions.append(Requeue(self.gang.key, max(0.0, wall - self.now.wall)))

    def _release(self, *, force: bool = False) -> None:
        let_go(self.state, self.planner, self.actions, force=force)

    def _status(self) -> JSON:
        return recorded_status(self.gang, self.state)

    def _failed(self) -> bool:
        """A PodGroup keeps Failed in its status. A gang without one (a Workload's, Koordinator's)
        failed when we said so; after a restart its timeout (counted from creation times) fails
        it again at once."""
        if self.gang.keeps_status:
            return self._status().get("phase") == "Failed"
        return self.state.failed_reported

    def _start(self) -> float | None:
        start = start_of(self.gang, self.state, self.now)
        if self.gang.keeps_status and start is not None:
            self.state.start = start  # kept: the time is read once, then stays
        return start

    def _fail(self) -> None:
        state = self.state
        self._release()
        why = state.reason or "no placement found"
        state.reason = ""
        if state.failed_reported:
            return
        state.failed_reported = True
        self.actions.append(Count("timeouts"))
        note = f"no placement for the whole gang within its {self.gang.timeout:g}s timeout: {why}"
        self._report("GangFailed", note, force=True)

    # -- planning ----------------------------------------------------------------------------------

    def _plan(self, bound: list[MemberPod], pending: list[MemberPod], start: float | None) -> None:
        gang, state, planner = self.gang, self.state, self.planner
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
        self.queued = True  # the first gang in queue order to wait takes the head
        hungry = starving(self.head, start, self.now.wall, self.settings.starvation_bound)
        seen = (tuple((m.key, m.uid) for m in ready), len(bound), gang.generation, hungry)
        if state.attempt == seen:
            return  # nothing changed since the last attempt found no room
        requests = planner.requests(ready)
        if len(requests) < need:
            return  # the cache has not caught up with a member yet
        restored = self.room.restore(state, ready, lambda p: self._commit(p, ready))
        if restored is not None:  # a hold recorded by an earlier leader (hold_record.py)
            self._report(*restored)
            return
        names = planner.admitting_nodes(ready)
        wanted = gang.api_object.min_resources if gang.api_object is not None else {}
        if wanted:
            removable = self.room.removable(requests[:need], hungry)
            short = planner.min_resources_shortage(wanted, names, removable)
            if short is not None:  # no plan can exist: do not search
                state.attempt, state.reason, state.wait_code = seen, short.message, "InsufficientResources"
                self.actions.append(Count("plans", "no_room"))
                return
        siblings = planner.sibling_nodes(gang.key, ready)
        levels = gang.levels
        found = planner.plan_gang(requests, siblings=siblings, names=names, levels=levels)
        if isinstance(found, NoPlan) and len(requests) > need:
            fewer = planner.plan_gang(requests[:need], siblings=siblings, names=names, levels=levels)
            found = fewer if isinstance(fewer, GangPlan) else found
        if isinstance(found, NoPlan):
            report = self.room.make_room(
                state, ready, requests, names, siblings, hungry, lambda p: self._commit(p, ready)
            )
            if report is not None:  # evicting lower-priority pods, or (starving) holding room
                self._report(*report)
                return
            state.attempt = seen
            state.reason = f"no placement for {need} more member(s) at once: {found.message}"
            state.wait_code = shortage_code(requests[:need], planner.whole_gpus_free(names))
            self.actions.append(Count("plans", "no_room"))
            return
        if not self._commit(found, ready):
            return
        self.actions.append(Count("plans", "planned"))
        state.reason = ""
        where = ", ".join(found.nodes) + (f" ({found.domain})" if found.domain else "")
        note = f"planned {len(found.placements)} member(s) on {where}; releasing them"
        self._report("GangPlanned", note, "Normal")

    def _plan_late(self, pending: list[MemberPod]) -> None:
        """Members beyond the minimum, one at a time (higher priority first): the gang already runs
        without them."""
        planner = self.planner
        for m in sorted(pending, key=lambda m: -m.priority):
            if m.key in self.state.plan or m.other_gates:
                continue
            requests = planner.requests([m])
            if not requests:
                continue
            found = planner.plan_gang(
                requests,
                siblings=planner.sibling_nodes(self.gang.key, [m]),
                names=planner.admitting_nodes([m]),
                levels=self.gang.levels,
            )
            if isinstance(found, GangPlan) and self._commit(found, [m]):
                continue
            if isinstance(found, NoPlan) and m.key not in self.state.told:
                self.state.told.add(m.key)
                self.actions.append(Event(member_ref(m), "Warning", "GangWaiting", found.message))

    def _commit(self, plan: GangPlan, members: list[MemberPod]) -> bool:
        """Reserve every placement, or none (the planner applies it at once and answers)."""
        by_key = {m.key: m for m in members}
        holds = tuple(Hold(p.key, by_key[p.key].uid, p.node, p.allocation.devices) for p in plan.placements)
        if not self.planner.hold(HoldPlan(self.gang.key, holds)):
            return False
        for p in plan.placements:
            devices = sum(len(entries) for entries in p.allocation.devices.by_type.values())
            self.state.plan[p.key] = Planned(by_key[p.key].uid, p.node, devices)
        self.state.planned_at = self.now.mono
        self.state.attempt = None
        return True

    # -- what follows from the decisions -------------------------------------------------------

    def _advance_preemption(self) -> None:
        seen = (self.gang.generation,)
        if self.room.should_replan(self.state, seen):
            replanned = self._replan(seen)
            if replanned is not None:
                self._report(*replanned, force=True)
        report = self.room.advance(self.state, lambda: self._release(force=True))
        if report is not None:
            reason, note, type_ = report
            self._report(reason, note, type_, force=reason != "GangPlanned")

    def _replan(self, seen: tuple[object, ...]) -> tuple[str, str, str] | None:
        """Evictions were refused: plan the held members again around the refused pods."""
        state, planner = self.state, self.planner
        by_key = {m.key: m for m in self.gang.members}
        members = [by_key[k] for k in state.plan if k in by_key]
        requests = planner.requests(members)
        if len(requests) < len(members):
            return None  # the cache has not caught up with a member yet
        names = planner.admitting_nodes(members)
        siblings = planner.sibling_nodes(self.gang.key, members)

        def swap(plan: GangPlan) -> bool:
            self._release(force=True)
            return self._commit(plan, members)

        return self.room.replan(state, members, requests, names, siblings, seen, swap)

    def _release_gates(self) -> None:
        state = self.state
        if state.preempting is not None:
            return  # the room is not free yet
        for m in self.gang.members:
            planned = state.plan.get(m.key)
            if planned is None or m.node:
                continue
            if m.gated:
                if state.ungating.get(m.key) != m.uid:
                    state.ungating[m.key] = m.uid
                    self.actions.append(Ungate(member_ref(m), keys.GANG_SCHEDULING_GATE, self.gang.key))
            elif (
                m.annotations.get(keys.GANG_PLANNED_NODE) != planned.node
                and state.nudged.get(m.key) != planned.node
            ):
                # Released earlier (by us before a restart, or never gated): kube-scheduler parked
                # it after our filter refused it; an update to the pod brings it back at once.
                state.nudged[m.key] = planned.node
                self.actions.append(Nudge(member_ref(m), planned.node, self.gang.key))

    def _write_status(self, failed: bool, start: float | None) -> None:
        gang, state = self.gang, self.state
        status = status_update(gang, state, failed, start, self._status(), self.now.wall)
        if status is None:
            return
        state.status = {k: v for k, v in status.items() if v}
        self.actions.append(WriteStatus(object_ref(gang), status, gang.key))

    def _report(self, reason: str, note: str, type_: str = "Warning", *, force: bool = False) -> None:
        """An Event once per distinct note: on the gang's object (a PodGroup, a Workload), or on
        each waiting member of a gang without one (Events are rate-limited: one per member of a
        256-pod gang would crowd out every other Event)."""
        gang, state = self.gang, self.state
        if gang.api_object is not None:
            code = state.wait_code if reason == "GangWaiting" else ""
            state.decision = Decision(reason, code, type_, note)  # told to the members (TellMembers)
        if note == state.reported and not force:
            return
        state.reported = note
        if gang.api_object is not None:
            self.actions.append(Event(object_ref(gang), type_, reason, note))
            return
        for m in gang.active:
            if not m.node:
                self.actions.append(Event(member_ref(m), type_, reason, f"gang {gang.key}: {note}"))
