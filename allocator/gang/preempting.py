"""Making room for a waiting gang: the cluster-wide victim plan, the evictions, and the wait.

When a gang fits nowhere, `plan_with_preemption` (core/gang/preemption.py) finds the cheapest set
of lower-priority pods (a running gang only whole) whose removal makes room for all its members
at once. The controller then holds the planned devices for the members (the plan's holds, which
every other pod's filter counts as taken, so a small pod cannot take the room being freed), keeps
the members gated, and evicts the victims through the Eviction API: a PodDisruptionBudget that
allows no disruption answers 429 and the eviction is retried on the next pass. Once every victim
is gone the members are released as for any plan; if they are not gone within
`preemption_timeout`, the holds are released and the gang waits (and may plan again).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

from allocator.core.gang.plan import GangPlan, PlanSettings
from allocator.core.gang.preemption import PreemptionPlan, whole_gpus_wanted
from allocator.core.gang.priority import gang_priority
from allocator.core.gang.victims import Candidate
from allocator.core.request.pod_request import PodRequest
from allocator.gang.cache_view import GangCache
from allocator.gang.controller_state import GangState, Preempting
from allocator.gang.hold_record import HoldRecord, restorable, victims_of
from allocator.gang.index import MemberPod
from allocator.gang.metrics import GangMetrics
from allocator.gang.writes import annotate_hold, clear_hold
from allocator.runtime.cache.victims import all_candidates
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.gang_settings import GangSettings
from allocator.runtime.kube import ApiError, KubeApi

Report = tuple[str, str, str]  # Event reason, note, type
LOWEST = -(2**31)  # a starvation hold waits for any pod, whatever its priority

log = logging.getLogger(__name__)


async def evict(api: KubeApi, victim: Candidate) -> str:
    """Evict one pod (uid precondition); "" when done or already gone, else why not."""
    namespace, _, name = victim.key.partition("/")
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": victim.uid}},
    }
    try:
        await api.raw("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body=body)
    except ApiError as exc:
        if exc.status in (404, 409):  # gone, or another pod of that name now
            return ""
        if exc.status == 429:
            return "a PodDisruptionBudget allows no disruption now"
        log.warning("evicting %s: %s", victim.key, exc)
        return str(exc)
    return ""


async def evict_into(api: KubeApi, p: Preempting, victim: Candidate) -> None:
    """Evict and record the outcome in `p` (refusals are retried on a later pass)."""
    p.evicting.add(victim.key)
    try:
        why = await evict(api, victim)
    finally:
        p.evicting.discard(victim.key)
    if why:
        p.blocked[victim.key] = why
    else:
        p.blocked.pop(victim.key, None)
        p.evicted.add(victim.key)


class GangPreemptor:
    """The controller's preemption steps for one gang at a time (the controller reports)."""

    def __init__(
        self,
        api: KubeApi,
        cache: GangCache,
        core: CoreAdapter,
        metrics: GangMetrics,
        settings: GangSettings,
        plan_settings: PlanSettings,
        clock: Callable[[], float],
    ) -> None:
        self.api = api
        self.cache = cache
        self.core = core
        self.metrics = metrics
        self.settings = settings
        self.plan_settings = plan_settings
        self.clock = clock
        self.writes: list[Awaitable[None]] = []  # hold records to write or clear, next pass

    def drain(self) -> list[Awaitable[None]]:
        out, self.writes = self.writes, []
        return out

    def make_room(
        self,
        state: GangState,
        ready: list[MemberPod],
        requests: list[PodRequest],
        names: list[str],
        siblings: dict[str, int],
        starving: bool,
        commit: Callable[[GangPlan], bool],
    ) -> Report | None:
        """Preempt (when allowed and some victims help), else hold room for a starving gang; the
        Event to report once the plan is committed and recorded on the members."""
        found = self.plan(requests, names, siblings) if self.settings.preemption else None
        evict = found is not None
        if found is None and starving:
            found = self.plan(requests, names, siblings, wait=True)
        if found is None or not commit(found.plan):
            return None
        note = self.started(state, found, evict=evict)
        self._record(state, ready, found.plan, evict)
        return ("GangPreempting" if evict else "GangHoldingRoom", note, "Normal")

    def restore(
        self, state: GangState, ready: list[MemberPod], commit: Callable[[GangPlan], bool]
    ) -> Report | None:
        """Continue a hold an earlier leader recorded on these members (gang/hold_record.py)."""
        found = restorable(ready)
        if found is None:
            return None
        plan, record = found
        node_of = {k: e.node for k, e in self.cache.pods.items() if k in record.victims}
        victims = [v for v in victims_of(record, node_of) if v.node]  # gone ones are done
        if not commit(plan):
            return None
        state.preempting = Preempting({v.key: v for v in victims}, self.clock(), evict=record.evict)
        state.record = record.plan
        nodes = ", ".join(plan.nodes)
        return ("GangHoldRestored", f"continuing the hold on {nodes} recorded by an earlier leader", "Normal")

    def _record(self, state: GangState, ready: list[MemberPod], plan: GangPlan, evict: bool) -> None:
        p = state.preempting
        assert p is not None
        state.record = uuid.uuid4().hex[:12]
        victims = {v.key: v.uid for v in p.victims.values()}
        by_key = {m.key: m for m in ready}
        for placement in plan.placements:
            record = HoldRecord(state.record, placement.node, placement.allocation.devices, victims, evict)
            self.writes.append(annotate_hold(self.api, by_key[placement.key], record.to_json()))

    def forget(self, state: GangState) -> None:
        """The hold ended: its records go (members that left need none)."""
        if state.record:
            for key, planned in state.plan.items():
                self.writes.append(clear_hold(self.api, key, planned.uid))
        state.record = ""

    @staticmethod
    def _holding(p: Preempting) -> str:
        nodes = sorted({v.node for v in p.victims.values()})
        return (
            f"holding the room on {', '.join(nodes)} as {len(p.victims)} pod(s) there finish; "
            "other pods backfill only devices the gang does not need"
        )

    def pass_summary(self, states: Mapping[str, GangState]) -> tuple[list[str], int]:
        """(the wait reason of every waiting gang, devices held for gangs that are preempting)."""
        reasons = [s.wait_code or "Waiting" for s in states.values() if s.reason]
        held = 0
        for state in states.values():
            if state.preempting is None:
                continue
            for key in state.plan:
                res = self.cache.ledger.reservations.get(key)
                if res is not None:
                    held += sum(len(entries) for entries in res.allocations.by_type.values())
        return reasons, held

    def starving(self, head: bool, start: float | None, now: float) -> bool:
        """The first waiting gang in queue order, waiting longer than the starvation bound."""
        bound = self.settings.starvation_bound
        return head and bound > 0 and start is not None and now - start >= bound

    def removable(self, requests: list[PodRequest], starving: bool) -> set[str]:
        """Keys of the running pods whose room the gang could get: every pod for a starving gang
        (it waits for them), else those of a lower priority when preemption is on (an upper
        bound: a running gang's member is counted alone, though it only goes with its gang)."""
        candidates = all_candidates(self.cache.pods, self.cache.ledger.reservations)
        if starving:
            return {c.key for c in candidates}
        if not self.settings.preemption:
            return set()
        priority = gang_priority(r.priority for r in requests)
        return {c.key for c in candidates if c.priority < priority}

    def plan(
        self, requests: list[PodRequest], names: list[str], siblings: dict[str, int], *, wait: bool = False
    ) -> PreemptionPlan | None:
        """A placement with the cheapest victims, or None (no victims help, or none needed).
        `wait`: every running pod counts (a starvation hold waits for them instead of evicting)."""
        candidates = all_candidates(self.cache.pods, self.cache.ledger.reservations)
        if wait:
            candidates = [replace(c, priority=LOWEST) for c in candidates]
        found = self.core.plan_with_preemption(
            requests,
            candidates,
            self.plan_settings,
            names=names,
            siblings=siblings,
        )
        return found if isinstance(found, PreemptionPlan) and found.victims else None

    def started(self, state: GangState, found: PreemptionPlan, *, evict: bool = True) -> str:
        """The plan holds: remember the victims; the Event note."""
        state.preempting = Preempting({v.key: v for v in found.victims}, self.clock(), evict=evict)
        state.reason = ""
        if not evict:
            state.reason, state.wait_code = self._holding(state.preempting), "HoldingRoom"
            return f"waited longer than {self.settings.starvation_bound:g}s: {state.reason}"
        self.metrics.preemptions.labels("started").inc()
        self.metrics.victims.inc(len(found.victims))
        return (
            f"preempting {len(found.victims)} lower-priority pod(s) on {', '.join(found.victim_nodes)} "
            f"for {len(found.plan.placements)} member(s); the freed devices are held for the gang"
        )

    def advance(
        self, state: GangState, release: Callable[[], None]
    ) -> tuple[list[Awaitable[None]], Report | None]:
        """Evict what is due; once every victim is gone the members may go (the plan's bind timeout
        counts from then); past `preemption_timeout` the hold is given up (`release`)."""
        p = state.preempting
        if p is None:
            return [], None
        left = p.left(self.cache)
        if not left:
            self.forget(state)
            state.preempting = None
            state.planned_at = self.clock()
            self.metrics.preemptions.labels("room_made").inc()
            return [], ("GangPlanned", "the victims are gone; releasing the members", "Normal")
        if not p.evict:  # a starvation hold: no evictions, released with the gang's timeout
            state.reason, state.wait_code = self._holding(p), "HoldingRoom"
            return [], None
        if self.clock() - p.since > self.settings.preemption_timeout:
            release()  # the controller's release, which forgets the hold records too
            self.metrics.preemptions.labels("timed_out").inc()
            why = "; ".join(sorted(set(p.blocked.values()))) or "they are still terminating"
            note = (
                f"{len(left)} victim(s) did not leave within {self.settings.preemption_timeout:g}s "
                f"({why}): the held devices are released"
            )
            return [], ("GangPreemptionTimedOut", note, "Warning")
        if p.blocked:
            state.reason = "preempting: eviction refused: " + "; ".join(sorted(set(p.blocked.values())))
            state.wait_code = "Preempting"
        return [evict_into(self.api, p, v) for v in p.due(left)], None


def shortage_code(requests: list[PodRequest], free: int) -> str:
    """Why no placement, in one word for the Waiting condition: enough whole GPUs are free on the
    nodes the gang may use (`free`) but not in a shape that holds it (InsufficientTopology), or
    not even that many (InsufficientResources)."""
    wanted = sum(whole_gpus_wanted(r) for r in requests)
    return "InsufficientTopology" if wanted and free >= wanted else "InsufficientResources"
