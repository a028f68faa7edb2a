"""The migration controller (leader only, off by default, a dry run until told otherwise).

Every `interval` it reads the moves in flight back from the Reservations it made, the running pods'
facts (PodDisruptionBudgets listed from the API) and the work waiting at least `minWait`, asks the
core for a defragmentation plan (`CoreAdapter.plan_defrag`) and the migration lifecycle for the
next steps (core/defrag/migration.py), and carries them out: a Reservation for each new move's
replacement on its target, the Eviction API for a pod whose room is Available, the Reservation
closed (marked, expired) once its move is done and out of the window, an Event on the pod and a
metric for every step. A dry run writes each planned move as an Event and the whole plan as a
ConfigMap report.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from allocator.core.defrag.migration import Evict, Finish, Hold, Report, Reserve, step
from allocator.core.defrag.plan import DefragPlan
from allocator.core.gang.plan import GangPlanSettings
from allocator.core.gang.victims import Candidate
from allocator.defrag import planning, writes
from allocator.defrag import reading as rd
from allocator.defrag.cache_view import DefragCache
from allocator.defrag.metrics import DefragMetrics
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.defrag_settings import DefragSettings
from allocator.runtime.events import EventSink, PodRef
from allocator.runtime.evictions import evict
from allocator.runtime.kube import KubeApi
from apis.timestamps import format_time

log = logging.getLogger(__name__)
JSON = dict[str, Any]


class MigrationController:
    def __init__(
        self,
        *,
        api: KubeApi,
        cache: DefragCache,
        core: CoreAdapter,
        settings: DefragSettings,
        events: EventSink,
        metrics: DefragMetrics,
        is_leader: Callable[[], bool],
        synced: Callable[[], bool],
        namespace: str,
        plan_settings: GangPlanSettings | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.api, self.cache, self.core, self.settings = api, cache, core, settings
        self.events, self.metrics = events, metrics
        self.is_leader, self.synced, self.wall = is_leader, synced, wall
        self.namespace = namespace
        self.plan_settings = plan_settings or GangPlanSettings()
        self.limits = planning.limits_of(settings)
        self.passes = 0
        self._running_now: dict[str, JSON] = {}
        self.last_plan: DefragPlan | None = None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.interval)
            if not self.is_leader() or not self.synced():
                continue
            try:
                await self.reconcile()
            except Exception:  # a bug in one pass must not stop the controller for good
                log.exception("defrag controller pass failed")

    async def reconcile(self) -> DefragPlan:
        now = self.wall()
        self.passes += 1
        got = await planning.plan_pass(
            self.api, self.cache, self.core, self.settings, self.plan_settings, now
        )
        self._running_now = got.running
        plan = got.plan
        self.last_plan = plan
        self.metrics.largest_block.set(plan.largest_before)
        inflight = got.inflight
        uids = {m.reservation: uid for m, uid, _ in inflight}
        s = self.settings
        actions = step([m for m, _, _ in inflight], plan, self.limits, now, dry_run=s.dry_run, caps=got.caps)
        for action in actions:
            await self._carry_out(action, uids)
        self.metrics.migrating.set(sum(1 for m, _, _ in inflight if not m.finished))
        if s.dry_run and s.report_config_map:
            await writes.write_report(self.api, self.namespace, s.report_config_map, report(plan, now))
        return plan

    async def _carry_out(self, action: Any, uids: dict[str, str]) -> None:
        if isinstance(action, Report):
            m = action.move
            self._event(
                m.key, m.uid, "Normal", "DefragPlanned", f"dry run: would move to {m.target} for {m.unblocks}"
            )
            self.metrics.steps.labels("planned").inc()
        elif isinstance(action, Hold):
            m = action.move
            self._event(m.key, m.uid, "Normal", "DefragHeld", f"move to {m.target} held back: {action.why}")
            self.metrics.steps.labels("held").inc()
        elif isinstance(action, Reserve):
            await self._reserve(action)
        elif isinstance(action, Evict):
            await self._evict(action, uids)
        elif isinstance(action, Finish):
            mig = action.migration
            stamp = format_time(self.wall())
            if await writes.close_reservation(
                self.api, mig.reservation, uids.get(mig.reservation, ""), action.reason, stamp
            ):
                self.metrics.steps.labels("finished").inc()
                if mig.pod_present:
                    self._event(
                        mig.pod, mig.uid, "Normal", "DefragGivenUp", f"move to {mig.target}: {action.reason}"
                    )

    async def _reserve(self, action: Reserve) -> None:
        m = action.move
        raw = self._running_now.get(m.key)
        if raw is None or (raw.get("metadata") or {}).get("uid") != m.uid:
            return
        ttl = f"{int(self.settings.reserve_timeout + self.settings.window)}s"
        body = writes.reservation_body(m, raw, m.unblocks, ttl)
        if await writes.create_reservation(self.api, body):
            self.metrics.steps.labels("reserved").inc()
            note = f"reserving room on {m.target} ({body['metadata']['name']}) for {m.unblocks}"
            self._event(m.key, m.uid, "Normal", "DefragReserved", note)

    async def _evict(self, action: Evict, uids: dict[str, str]) -> None:
        mig = action.migration
        entry = self.cache.pods.get(mig.pod)
        why = await evict(
            self.api, Candidate(mig.pod, mig.source, entry.priority if entry else 0, "", mig.uid)
        )
        if why:
            self._event(mig.pod, mig.uid, "Warning", "DefragEvictionRefused", why)
            return
        await writes.mark_evicted(self.api, mig.reservation, uids.get(mig.reservation, ""))
        self.metrics.steps.labels("evicted").inc()
        raw = self._running_now.get(mig.pod)
        if entry is not None and raw is not None:
            started = rd.parse_time((raw.get("status") or {}).get("startTime"))
            gpus = (
                len(entry.usage.allocations.minors("gpu")) if entry.usage and entry.usage.allocations else 0
            )
            if started is not None:
                self.metrics.gpu_hours.inc(max(0.0, self.wall() - started) * gpus / 3600)
        self._event(
            mig.pod, mig.uid, "Normal", "DefragEvicted", f"evicted; its replacement has room on {mig.target}"
        )

    def _event(self, key: str, uid: str, type_: str, reason: str, note: str) -> None:
        namespace, _, name = key.partition("/")
        with contextlib.suppress(Exception):
            self.events.record(PodRef(namespace, name, uid), type_, reason, "Defragment", note)


def report(plan: DefragPlan, now: float) -> JSON:
    """The plan as the dry run's report (and `topoalloc defrag -o json`) shows it."""
    return {
        "time": now,
        "largestFreeBlock": {"before": plan.largest_before, "after": plan.largest_after},
        "moves": [
            {
                "pod": m.key,
                "from": m.source,
                "to": m.target,
                "gpus": m.gpus,
                "devices": m.allocation.minors("gpu"),
                "gpuHoursLost": round(m.gpu_hours, 3),
                "unblocks": m.unblocks,
            }
            for m in plan.moves
        ],
        "unblocked": [
            {"waiter": u.waiter, "moves": list(u.moves), "cheapest": u.exact} for u in plan.unblocked
        ],
        "fitWithoutMoves": list(plan.fits),
        "stuck": [{"waiter": w, "why": why} for w, why in plan.stuck],
    }
