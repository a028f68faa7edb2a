"""One pass's reading and planning, shared by the migration controller and `topoalloc defrag`
(read-only), so the command shows the plan the controller would make: the bound pods and the
PodDisruptionBudgets listed from the API, the moves in flight read back from the Reservations,
the waiters, the plan, and each workload's own limit."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from allocator.core.defrag.inputs import DefragPlanSettings, PodFacts, Waiter
from allocator.core.defrag.migration import Limits, Migration
from allocator.core.defrag.plan import DefragPlan
from allocator.core.gang.plan import GangPlanSettings
from allocator.defrag import reading as rd
from allocator.defrag import workloads as wl
from allocator.defrag.cache_view import DefragCache
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.defrag_settings import DefragSettings
from allocator.runtime.kube import ApiError, KubeApi
from apis.kinds import PDBS, PODS

log = logging.getLogger(__name__)
JSON = dict[str, Any]
# Bound pods that have not finished: a pod still starting (Pending, its images pulling) holds its
# GPUs as much as a Running one.
BOUND = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


@dataclass
class Pass:
    plan: DefragPlan
    inflight: list[tuple[Migration, str, str]]  # (move, its Reservation's uid, the waiter)
    facts: list[PodFacts]  # the pods the planner weighed (those moving left out)
    waiters: list[Waiter]
    options: DefragPlanSettings
    running: dict[str, JSON]  # bound pods by key, as listed
    budgets_read: bool
    caps: dict[str, tuple[int, str]] = field(default_factory=dict)


async def bound_pods(api: KubeApi) -> dict[str, JSON]:
    """Raises ApiError (the caller decides what a failed list means)."""
    got = await api.raw("GET", PODS.path(), query={"fieldSelector": BOUND})
    out = {}
    for pod in got.get("items") or []:
        meta = pod.get("metadata") or {}
        out[f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"] = pod
    return out


async def budgets(api: KubeApi) -> list[JSON]:
    got = await api.raw("GET", PDBS.path())
    return list(got.get("items") or [])


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
    api: KubeApi,
    cache: DefragCache,
    core: CoreAdapter,
    settings: DefragSettings,
    plan_settings: GangPlanSettings,
    now: float,
    *,
    strict: bool = False,
) -> Pass:
    """Read and plan. A list that fails leaves no pod movable this pass (logged), or with `strict`
    raises the ApiError (the command reports it)."""
    try:
        running = await bound_pods(api)
    except ApiError as exc:
        if strict:
            raise
        log.warning("listing bound pods: %s (no pod moves this pass)", exc)
        running = {}
    try:
        pdbs: list[JSON] | None = await budgets(api)
    except ApiError as exc:
        if strict:
            raise
        log.warning("listing PodDisruptionBudgets: %s (no pod moves this pass)", exc)
        pdbs = None
    inflight = rd.migrations(cache)
    # A waiter is planned for again only once its moves are done and their pods gone: a pod
    # evicted but still terminating (its grace period) holds the room the waiter is to get.
    busy = {waiter for m, _, waiter in inflight if not m.finished or _still_there(cache, m)}
    # Budgets that cannot be read protect every pod: a move must never break one.
    protected = set(running) if pdbs is None else rd.protected_keys(running, pdbs)
    moving = {m.pod for m, _, _ in inflight}
    facts = [f for f in rd.pod_facts(cache, core, running, protected, now) if f.key not in moving]
    waiters = rd.waiters(cache, core, now, settings.min_wait, busy)
    options = options_of(settings, plan_settings)
    plan = core.plan_defrag(waiters, facts, options, now)
    out = Pass(plan, inflight, facts, waiters, options, running, pdbs is not None)
    movers = {m.key for m in plan.moves}
    weighed = [f for f in facts if f.key in movers]
    if weighed:
        owners = await wl.fetch_owners(api, (f.workload for f in weighed))
        out.caps = wl.caps(weighed, owners, wl.budget_allowed(pdbs or [], running))
    return out


def _still_there(cache: DefragCache, m: Migration) -> bool:
    entry = cache.pods.get(m.pod)
    return entry is not None and entry.uid == m.uid and entry.holds
