"""The gang controller (leader only): runs the core's gang lifecycle and carries out what it decides.

The decisions are the core's (allocator/core/gang/lifecycle.py: plan each gang as a whole, let its
members go only then, preempt, time out, report); this module only acts, on the controller runner
(allocator/runtime/runner.py: woken by the watch cache, batched, at least every `resyncPeriod`, and
by the deadlines the lifecycle names with `Requeue`). Each pass is whole: it builds every gang's
view from the member index and the watch cache (gang/plan_inputs.py), steps through the gangs in
the lifecycle's queue order with the cluster behind a planner (gang/planner.py: the core's
decisions through CoreAdapter, the ledger's holds applied at once), and applies each step's actions
in the order given: Events and metrics at once, API writes (gate removals, planned-node
annotations, evictions, PodGroup status, hold records) together at the end of the pass. What those
writes answer goes back to the gang's next step (`Outcomes`, by the action's `owner`).

Plans live in this process only (here and as the ledger's holds, gang/holds.py). A new leader, or
a restarted allocator, starts without them: gated members are planned afresh (or a hold recorded
on them is continued), members already released but not bound are held by the extender's filter
until planned again, bound members count as placed. No member is bound against an older plan.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from allocator.core.actions import (
    Count,
    Event,
    Evict,
    Nudge,
    ObjectRef,
    Observe,
    Requeue,
    Ungate,
    WriteStatus,
)
from allocator.core.gang.actions import Action, ClearHold, RecordHold, TellMembers
from allocator.core.gang.gang_pass import GangPass
from allocator.core.gang.gang_state import GangState
from allocator.core.gang.lifecycle import release_all
from allocator.core.gang.plan import GangPlanSettings
from allocator.core.gang.victims import Candidate
from allocator.core.gang.view import Clocks, MemberPod, Outcomes
from allocator.gang.cache_view import GangCache
from allocator.gang.holds import PlanHolds
from allocator.gang.index import GangIndex
from allocator.gang.member_events import MemberEvents
from allocator.gang.metrics import GangMetrics
from allocator.gang.plan_inputs import gang_view
from allocator.gang.planner import ClusterPlanner
from allocator.gang.preempting import evict
from allocator.gang.writes import (
    annotate_hold,
    annotate_planned_node,
    clear_hold,
    patch_podgroup_status,
    record_event,
    remove_gate,
)
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.events import EventSink
from allocator.runtime.gang_settings import GangSettings
from allocator.runtime.kube import KubeApi
from allocator.runtime.runner import Batch, ControllerMetrics, Runner, RunnerSettings
from allocator.runtime.topology import Topology
from apis.podgroup import GangRef

JSON = dict[str, Any]
Effect = Awaitable[None]


@dataclass
class _Answers:
    """What the API answered to one gang's writes since its last step."""

    evictions: dict[str, str] = field(default_factory=dict)
    gates_refused: set[str] = field(default_factory=set)
    status_refused: bool = False

    def outcomes(self) -> Outcomes:
        return Outcomes(dict(self.evictions), frozenset(self.gates_refused), self.status_refused)


class GangController:
    """The runner's `Reconciler` for gangs; `runner` runs it."""

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
        plan_settings: GangPlanSettings,
        topology: Topology | None = None,
        controller_metrics: ControllerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.cache = cache
        self.index = index
        self.settings = settings
        self.metrics = metrics
        self.events = events
        self.clock = clock
        self.wall = wall
        self.topology = topology or Topology(settings, cache)
        self.planner = ClusterPlanner(cache, core, holds, index, plan_settings, self.topology)
        self.member_events = MemberEvents(events, clock)
        self.states: dict[str, GangState] = {}
        self._refs: dict[str, GangRef] = {}  # gang key -> how its members named it, while it has a state
        self._answers: dict[str, _Answers] = {}  # gang key -> its writes' answers, for its next step
        self._members: dict[str, MemberPod] = {}  # the members as this pass's views show them
        self._evicting: set[str] = set()  # victims whose eviction is in flight
        runner_settings = RunnerSettings(resync=settings.resync_period, batch_delay=settings.batch_delay)
        self.runner = Runner(
            "gang", self, runner_settings, is_leader=is_leader, synced=synced, metrics=controller_metrics
        )

    def making_room(self, gang: str) -> bool:
        """The gang holds room its victims (or the pods finishing there) still occupy: its members
        must not bind yet. (Gated members never ask; ungated ones do, at filter and bind.)"""
        state = self.states.get(gang)
        return state is not None and state.preempting is not None

    def step_down(self) -> None:
        """Leadership lost: the next leader plans from scratch, so hold nothing here."""
        self.planner.release(release_all(self.states.values()))
        self.states.clear()
        self._answers.clear()

    def _now(self) -> Clocks:
        return Clocks(self.clock(), self.wall())

    async def reconcile(self, batch: Batch) -> None:
        """Every gang, woken or not: the queue order and the starvation head are the whole queue's."""
        answers, self._answers = self._answers, {}
        gangs = []
        for key in sorted(set(self.index.by_gang) | set(self.states)):
            got = answers.get(key)
            outcomes = got.outcomes() if got is not None else None
            view = gang_view(
                self.index, self.cache, self.settings, key, outcomes, self._refs.get(key), self.topology
            )
            if (ref := self.index.ref(key)) is not None:
                self._refs[key] = ref
            gangs.append(view)
        self._members = {m.key: m for g in gangs for m in g.members}
        run = GangPass(gangs, self.states, self._now(), self.settings)
        effects: list[Effect] = []
        try:
            for gang in run.order:
                for action in run.step(gang, self._now(), self.planner):
                    effects.extend(self._apply(action))
            self.metrics.new_pass()
            for action in run.finish():
                effects.extend(self._apply(action))
        finally:
            self.states = run.states  # the gangs stepped so far hold what the ledger holds for them
            self._refs = {k: ref for k, ref in self._refs.items() if k in self.states}
        await self.runner.gather(effects)

    # -- carrying actions out ----------------------------------------------------------------------

    def _apply(self, action: Action) -> list[Effect]:
        """Events and metrics now; API writes as effects the pass awaits together."""
        match action:
            case Event(target, type_, reason, note):
                record_event(self.events, target, type_, reason, note)
            case TellMembers(gang, state):
                self.member_events.tell(gang, state)
            case Ungate(pod, _, owner) if pod.key in self._members:
                return [self._remove_gate(owner, self._members[pod.key])]
            case Nudge(pod, node):
                return [annotate_planned_node(self.api, pod, node)]
            case Evict(pod, node, owner) if pod.key not in self._evicting:
                return [self._evict(owner, Candidate(pod.key, node, 0, "", pod.uid))]
            case WriteStatus(target, status, owner):
                # Counted as refused until the API takes it: a pass that breaks off before (or
                # while) writing must write it again, not trust the status it meant to write.
                self._answers_of(owner).status_refused = True
                return [self._patch_status(owner, target, status)]
            case RecordHold(member, record):
                return [annotate_hold(self.api, member, record.to_json())]
            case ClearHold(key, uid):
                return [clear_hold(self.api, key, uid)]
            case Count(metric, label, by):
                self.metrics.count(metric, label, by)
            case Observe(metric, value, label):
                self.metrics.observe(metric, value, label)
            case Requeue(key, after):
                self.runner.after(key, after)
        return []

    def _answers_of(self, gang: str) -> _Answers:
        return self._answers.setdefault(gang, _Answers())

    async def _remove_gate(self, gang: str, m: MemberPod) -> None:
        if not await remove_gate(self.api, m):
            # The next step sees the pod as it is now and tries again (or finds it gone).
            self._answers_of(gang).gates_refused.add(m.key)

    async def _evict(self, gang: str, victim: Candidate) -> None:
        self._evicting.add(victim.key)
        try:
            why = await evict(self.api, victim)
        finally:
            self._evicting.discard(victim.key)
        self._answers_of(gang).evictions[victim.key] = why

    async def _patch_status(self, gang: str, target: ObjectRef, status: JSON) -> None:
        if await patch_podgroup_status(self.api, target, status):
            self._answers_of(gang).status_refused = False  # else written again next pass
