"""One pass's reading and planning, shared by the migration controller and `topoalloc defrag`
(read-only), so the command shows the plan the controller would make: the bound pods and the
PodDisruptionBudgets from the watch cache, the moves in flight read back from the Reservations,
the waiters, the plan, and each workload's own limits (its owner read once in a while, its pods
down now counted from the cache)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from allocator.core.defrag.inputs import DefragPlanSettings, PodFacts, Waiter
from allocator.core.defrag.migration import Limits, Migration, WorkloadCap
from allocator.core.defrag.plan import DefragPlan
from allocator.core.gang.plan import GangPlanSettings
from allocator.defrag import reading as rd
from allocator.defrag import workloads as wl
from allocator.defrag.cache_view import DefragCache
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.defrag_settings import DefragSettings


@dataclass
class Pass:
    plan: DefragPlan
    inflight: list[rd.InFlight]
    facts: list[PodFacts]  # the pods the planner weighed (those moving left out)
    waiters: list[Waiter]
    options: DefragPlanSettings
    budgets_read: bool
    caps: dict[str, tuple[WorkloadCap, ...]] = field(default_factory=dict)

    @property
    def migrations(self) -> list[Migration]:
        return [f.migration for f in self.inflight]


def options_of(settings: DefragSettings, plan: GangPlanSettings) -> DefragPlanSettings:
    return DefragPlanSettings(
        allow_bare=settings.allow_bare_pods,
        proactive=settings.proactive,
        proactive_priority=settings.proactive_priority,
        max_moves=settings.max_moves_per_plan,
        plan=plan,
    )


def limits_of(s: DefragSettings) -> Limits:
    return Limits(
        s.max_migrating,
        s.max_migrating_per_namespace,
        s.max_migrating_per_workload,
        s.max_per_window,
        s.window,
        s.reserve_timeout,
    )


async def plan_pass(
    cache: DefragCache,
    core: CoreAdapter,
    settings: DefragSettings,
    plan_settings: GangPlanSettings,
    now: float,
    owners: wl.Owners,
    *,
    budgets_read: bool = True,
) -> Pass:
    """Read and plan. `budgets_read`: the PodDisruptionBudgets could be read (else every pod
    counts as protected)."""
    inflight = rd.migrations(cache)
    # A waiter is planned for again only once its moves are done and their pods gone: a pod
    # evicted but still terminating (its grace period) holds the room the waiter is to get.
    busy = {f.waiter for f in inflight if not f.migration.finished(now) or _still_there(cache, f.migration)}
    moving = {f.migration.pod for f in inflight}
    facts = [f for f in rd.pod_facts(cache, core, now, budgets_read=budgets_read) if f.key not in moving]
    waiters = rd.waiters(cache, core, now, settings.min_wait, busy)
    options = options_of(settings, plan_settings)
    plan = core.plan_defrag(waiters, facts, options, now)
    out = Pass(plan, inflight, facts, waiters, options, budgets_read)
    movers = {m.key for m in plan.moves}
    weighed = [f for f in facts if f.key in movers]
    if weighed:
        named = {f.workload for f in weighed if f.workload}
        found = await owners.of(named)
        ready = rd.ready_pods(cache, found)
        evicted = Counter(m.workload for m in out.migrations if m.evicted and not m.finished(now))
        down = {w: wl.unavailable(owner, ready.get(w, 0), evicted[w]) for w, owner in found.items()}
        allowed = {
            f.key: min(n for _, n in budgets)
            for f in weighed
            if (entry := cache.pods.get(f.key)) is not None and (budgets := rd.budgets_of(cache, entry))
        }
        out.caps = wl.caps(weighed, found, allowed, down)
    return out


def _still_there(cache: DefragCache, m: Migration) -> bool:
    entry = cache.pods.get(m.pod)
    return entry is not None and entry.uid == m.uid and entry.holds
