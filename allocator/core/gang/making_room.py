"""Making room for a waiting gang: the lifecycle's preemption and starvation-hold decisions.

When a gang fits nowhere, `plan_with_preemption` (preemption.py) finds the cheapest set of
lower-priority pods (a running gang only whole) whose removal makes room for all its members at
once. The plan's devices are then held for the members (every other pod's filter counts them as
taken, so a small pod cannot take the room being freed), the members stay gated, and the victims
are evicted through the Eviction API (the caller's `Evict`). Victims are chosen around
PodDisruptionBudgets (victims.py: protected pods are the last resort); when the Eviction API
refuses one anyway (429: the budget allows no disruption now), the next step re-plans around the
pods that cannot go (`replan`): a placement whose victims include none of them and break no budget
replaces the hold; without one the refused evictions are retried on every step. Once every victim
is gone the members are released as for any plan; if they are not gone within
`preemption_timeout`, the holds are released and the gang waits (and may plan again). A starving
gang (the first waiting one, past `starvation_bound`) holds the room of the nodes it needs fewest
pods to leave without evicting anyone. Each hold is recorded on the members
(hold_record.py) so that a new leader continues it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import replace

from allocator.core.actions import Count, Evict, ObjectRef
from allocator.core.gang.actions import Action, ClearHold, RecordHold
from allocator.core.gang.gang_state import GangState, Preempting
from allocator.core.gang.hold_record import HoldRecord, restorable, victims_of
from allocator.core.gang.levels import Levels
from allocator.core.gang.plan import GangPlan
from allocator.core.gang.planner import LifecycleSettings, Planner
from allocator.core.gang.preemption import PreemptionPlan, whole_gpus_wanted
from allocator.core.gang.priority import gang_priority
from allocator.core.gang.victims import Candidate, violations
from allocator.core.gang.view import Clocks, MemberPod
from allocator.core.request.pod_request import PodRequest

EventNote = tuple[str, str, str]  # Event reason, note, type
LOWEST = -(2**31)  # a starvation hold waits for any pod, whatever its priority


def starving(head: bool, start: float | None, now: float, bound: float) -> bool:
    """The first waiting gang in queue order, waiting longer than the starvation bound."""
    return head and bound > 0 and start is not None and now - start >= bound


def shortage_code(requests: list[PodRequest], free: int) -> str:
    """Why no placement, in one word for the Waiting condition: enough whole GPUs are free on the
    nodes the gang may use (`free`) but not in a shape that holds it (InsufficientTopology), or
    not even that many (InsufficientResources)."""
    wanted = sum(whole_gpus_wanted(r) for r in requests)
    return "InsufficientTopology" if wanted and free >= wanted else "InsufficientResources"


def holding_note(p: Preempting) -> str:
    nodes = sorted({v.node for v in p.victims.values()})
    return (
        f"holding the room on {', '.join(nodes)} as {len(p.victims)} pod(s) there finish; "
        "other pods backfill only devices the gang does not need"
    )


def plan_id(gang: str, wall: float, members: list[MemberPod]) -> str:
    """An id for a hold's records, the same on every member of it and different for every hold."""
    seed = "\n".join([gang, repr(wall), *sorted(m.uid for m in members)])
    return hashlib.blake2b(seed.encode(), digest_size=6).hexdigest()


class RoomMaking:
    """One gang's preemption steps within a lifecycle step (the step reports what they return)."""

    def __init__(
        self,
        gang: str,
        planner: Planner,
        settings: LifecycleSettings,
        now: Clocks,
        actions: list[Action],
        levels: Levels | None = None,
    ) -> None:
        self.gang = gang
        self.planner = planner
        self.settings = settings
        self.now = now
        self.actions = actions
        self.levels = levels  # the gang's topology levels: victims only where a plan may go

    def make_room(
        self,
        state: GangState,
        ready: list[MemberPod],
        requests: list[PodRequest],
        names: list[str],
        siblings: dict[str, int],
        starving: bool,
        commit: Callable[[GangPlan], bool],
    ) -> EventNote | None:
        """Preempt (when allowed and some victims help), else hold room for a starving gang; the
        Event to report once the plan is held and recorded on the members."""
        found = self.victims(requests, names, siblings) if self.settings.preemption else None
        evict = found is not None
        if found is None and starving:
            found = self.victims(requests, names, siblings, wait=True)
        if found is None or not commit(found.plan):
            return None
        note = self._started(state, found, evict=evict)
        self._record(state, ready, found.plan, evict)
        return ("GangPreempting" if evict else "GangHoldingRoom", note, "Normal")

    def restore(
        self, state: GangState, ready: list[MemberPod], commit: Callable[[GangPlan], bool]
    ) -> EventNote | None:
        """Continue a hold an earlier leader recorded on these members (hold_record.py)."""
        found = restorable(ready)
        if found is None:
            return None
        plan, record = found
        node_of = self.planner.pod_nodes(record.victims)
        victims = [v for v in victims_of(record, node_of) if v.node]  # gone ones are done
        if not commit(plan):
            return None
        state.preempting = Preempting({v.key: v for v in victims}, self.now.mono, evict=record.evict)
        state.record = record.plan
        nodes = ", ".join(plan.nodes)
        return ("GangHoldRestored", f"continuing the hold on {nodes} recorded by an earlier leader", "Normal")

    def _record(self, state: GangState, ready: list[MemberPod], plan: GangPlan, evict: bool) -> None:
        p = state.preempting
        assert p is not None
        state.record = plan_id(self.gang, self.now.wall, ready)
        victims = {v.key: v.uid for v in p.victims.values()}
        by_key = {m.key: m for m in ready}
        for placement in plan.placements:
            record = HoldRecord(state.record, placement.node, placement.allocation.devices, victims, evict)
            self.actions.append(RecordHold(by_key[placement.key], record))

    def forget(self, state: GangState) -> None:
        """The hold ended: its records go (members that left need none)."""
        if state.record:
            for key, planned in state.plan.items():
                self.actions.append(ClearHold(key, planned.uid))
        state.record = ""

    def removable(self, requests: list[PodRequest], starving: bool) -> set[str]:
        """Keys of the running pods whose room the gang could get: every pod for a starving gang
        (it waits for them), else those of a lower priority when preemption is on (an upper
        bound: a running gang's member is counted alone, though it only goes with its gang)."""
        candidates = self.planner.running()
        if starving:
            return {c.key for c in candidates}
        if not self.settings.preemption:
            return set()
        priority = gang_priority(r.priority for r in requests)
        return {c.key for c in candidates if c.priority < priority}

    def victims(
        self, requests: list[PodRequest], names: list[str], siblings: dict[str, int], *, wait: bool = False
    ) -> PreemptionPlan | None:
        """A placement with the cheapest victims, or None (no victims help, or none needed).
        `wait`: every running pod counts (a starvation hold waits for them instead of evicting)."""
        candidates = self.planner.running()
        if wait:
            candidates = [replace(c, priority=LOWEST) for c in candidates]
        found = self.planner.plan_with_preemption(
            requests, candidates, names=names, siblings=siblings, levels=self.levels
        )
        return found if isinstance(found, PreemptionPlan) and found.victims else None

    def replan(
        self,
        state: GangState,
        members: list[MemberPod],
        requests: list[PodRequest],
        names: list[str],
        siblings: dict[str, int],
        seen: tuple[object, ...],
        swap: Callable[[GangPlan], bool],
    ) -> EventNote | None:
        """Evictions were refused: a placement whose victims leave out every refused pod and break
        no PodDisruptionBudget replaces the hold (`swap` releases the old holds and reserves the
        new ones); None when there is none (the refused evictions are retried, and the search
        again when `seen` changes)."""
        p = state.preempting
        assert p is not None
        refused = p.refused | self.cannot_go(p)
        candidates = [c for c in self.planner.running() if c.key not in refused]
        found = self.planner.plan_with_preemption(requests, candidates, names=names, siblings=siblings)
        if not isinstance(found, PreemptionPlan) or violations(found.victims) or not swap(found.plan):
            p.refused, p.replanned = refused, seen
            return None
        why = "; ".join(sorted(set(p.blocked.values()))) or "refused"
        if not found.victims:  # room enough without them now: the members may go
            self.actions.append(Count("preemptions", "room_made"))
            note = f"eviction of {len(refused)} pod(s) refused ({why}); room without them now"
            return ("GangPlanned", note + ": releasing the members", "Normal")
        note = self._started(state, found, outcome="replanned")
        assert state.preempting is not None
        state.preempting.refused = refused
        self._record(state, members, found.plan, True)
        note = f"eviction of {len(refused)} pod(s) refused ({why}): re-planned around them; {note}"
        return ("GangPreempting", note, "Normal")

    def should_replan(self, state: GangState, seen: tuple[object, ...]) -> bool:
        """A refusal not re-planned around yet, or the cluster changed since a fruitless try."""
        p = state.preempting
        if p is None or not p.evict or not p.blocked:
            return False
        stuck = self.cannot_go(p)
        return bool(stuck) and (not stuck <= p.refused or p.replanned != seen)

    def cannot_go(self, p: Preempting) -> frozenset[str]:
        """The refused victims to plan around: all of them, but those every budget selecting them
        now allows a disruption again (asked again, their eviction goes through)."""
        now = {c.key: c for c in self.planner.running()}
        return frozenset(
            key
            for key in p.blocked
            if not ((c := now.get(key)) is not None and c.budgets and all(n > 0 for _, n in c.budgets))
        )

    def _started(
        self, state: GangState, found: PreemptionPlan, *, evict: bool = True, outcome: str = "started"
    ) -> str:
        """The plan holds: remember the victims; the Event note."""
        state.preempting = Preempting({v.key: v for v in found.victims}, self.now.mono, evict=evict)
        state.reason = ""
        if not evict:
            state.reason, state.wait_code = holding_note(state.preempting), "HoldingRoom"
            return f"waited longer than {self.settings.starvation_bound:g}s: {state.reason}"
        self.actions.append(Count("preemptions", outcome))
        self.actions.append(Count("victims", by=len(found.victims)))
        return (
            f"preempting {len(found.victims)} lower-priority pod(s) on {', '.join(found.victim_nodes)} "
            f"for {len(found.plan.placements)} member(s); the freed devices are held for the gang"
        )

    def advance(self, state: GangState, release: Callable[[], None]) -> EventNote | None:
        """Evict what is due; once every victim is gone the members may go (the plan's bind timeout
        counts from then); past `preemption_timeout` the hold is given up (`release`)."""
        p = state.preempting
        if p is None:
            return None
        left = self.planner.still_holding(p.victims.values())
        if not left:
            self.forget(state)
            state.preempting = None
            state.planned_at = self.now.mono
            self.actions.append(Count("preemptions", "room_made"))
            return ("GangPlanned", "the victims are gone; releasing the members", "Normal")
        if not p.evict:  # a starvation hold: no evictions, released with the gang's timeout
            state.reason, state.wait_code = holding_note(p), "HoldingRoom"
            return None
        if self.now.mono - p.since > self.settings.preemption_timeout:
            release()  # the step's release, which forgets the hold records too
            self.actions.append(Count("preemptions", "timed_out"))
            why = "; ".join(sorted(set(p.blocked.values()))) or "they are still terminating"
            note = (
                f"{len(left)} victim(s) did not leave within {self.settings.preemption_timeout:g}s "
                f"({why}): the held devices are released"
            )
            return ("GangPreemptionTimedOut", note, "Warning")
        if p.blocked:
            state.reason = "preempting: eviction refused: " + "; ".join(sorted(set(p.blocked.values())))
            if p.replanned is not None:
                state.reason += "; no placement around the refused pods keeps every budget: asking again"
            state.wait_code = "Preempting"
        self.actions.extend(victim_eviction(self.gang, v) for v in p.due(left))
        return None


def victim_eviction(gang: str, victim: Candidate) -> Evict:
    """Evict `victim` for `gang` (uid precondition: never a re-created pod of the name)."""
    namespace, _, name = victim.key.partition("/")
    return Evict(ObjectRef(namespace, name, victim.uid), victim.node, owner=gang)


def fold_evictions(p: Preempting | None, evictions: Mapping[str, str]) -> None:
    """What became of the evictions sent last time: accepted, or refused and why."""
    if p is None or not evictions:
        return
    for key, why in evictions.items():
        if why:
            p.blocked[key] = why
        else:
            p.blocked.pop(key, None)
            p.evicted.add(key)
