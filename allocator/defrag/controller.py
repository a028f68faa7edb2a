"""The migration controller (leader only, off by default, a dry run until told otherwise).

On the controller runner (allocator/runtime/runner.py: every `interval`, and at once when one of
its own Reservations changes or a pod it moves or its replacement does; it steps down with
leadership), each pass reads the moves in flight back from the Reservations it made, the running
pods' facts and PodDisruptionBudgets from the watch cache and the work waiting at least `minWait`
(allocator/defrag/planning.py), asks the core for a defragmentation plan and the migration
lifecycle for the next steps (core/defrag/migration.py), and carries them out with one `match`: a
Reservation for each new move's replacement on its target, the Eviction API for a pod whose room is
Available, the Reservation closed (marked, expired) once its move is over and out of the window,
an Event on the pod and a metric for every step. A dry run writes each planned move as an Event and
the whole plan as a ConfigMap report.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from allocator.core.actions import Count, Event, Evict, ObjectRef
from allocator.core.defrag.migration import (
    Action,
    CloseReservation,
    CreateReservation,
    Migration,
    pod_ref,
    step,
)
from allocator.core.defrag.plan import DefragPlan, Move
from allocator.core.gang.plan import GangPlanSettings
from allocator.core.gang.victims import Candidate
from allocator.defrag import planning, writes
from allocator.defrag import reading as rd
from allocator.defrag.cache_view import DefragCache
from allocator.defrag.metrics import DefragMetrics
from allocator.defrag.report import report
from allocator.defrag.workloads import Owners
from allocator.runtime.cache.records import outline_pod
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.defrag_settings import DefragSettings
from allocator.runtime.events import EventSink, PodRef
from allocator.runtime.evictions import evict
from allocator.runtime.kube import PODS, RESERVATIONS, KubeApi
from allocator.runtime.runner import Batch, ControllerMetrics, Runner, RunnerSettings
from apis.timestamps import format_time, parse_time

JSON = dict[str, Any]
Effect = Awaitable[None]
BATCH_DELAY = 0.25  # a Reservation's status and its pod's eviction land in one pass


class MigrationController:
    """The runner's `Reconciler` for defragmentation; `runner` runs it."""

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
        budgets_read: Callable[[], bool] = lambda: True,
        plan_settings: GangPlanSettings | None = None,
        controller_metrics: ControllerMetrics | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.api, self.cache, self.core, self.settings = api, cache, core, settings
        self.events, self.metrics, self.wall = events, metrics, wall
        self.namespace = namespace
        self.budgets_read = budgets_read
        self.plan_settings = plan_settings or GangPlanSettings()
        self.limits = planning.limits_of(settings)
        self.owners = Owners(api)
        self.last_plan: DefragPlan | None = None
        self._rooms: dict[str, rd.InFlight] = {}  # Reservation name -> the move it holds, this pass
        self._watched: set[str] = set()  # pods moving and their replacements: a change wakes a pass
        runner_settings = RunnerSettings(resync=settings.interval, batch_delay=BATCH_DELAY)
        self.runner = Runner(
            "defrag", self, runner_settings, is_leader=is_leader, synced=synced, metrics=controller_metrics
        )

    def observe(self, kind: str, key: str, obj: JSON | None) -> None:
        """The watch cache's changes: its own Reservations' and those of the pods it moves."""
        if (kind == RESERVATIONS.name and (key in self._rooms or _labelled(obj))) or (
            kind == PODS.name and key in self._watched
        ):
            self.runner.wake(key)

    def step_down(self) -> None:
        """Leadership lost: what this leader read goes (the next one reads the moves back)."""
        self.owners.forget()
        self._rooms, self._watched, self.last_plan = {}, set(), None

    async def reconcile(self, batch: Batch) -> None:
        await self.run_pass()

    async def run_pass(self) -> DefragPlan:
        """One pass over every move and waiter (the plan is the whole cluster's); the plan made."""
        now, s = self.wall(), self.settings
        got = await planning.plan_pass(
            self.cache, self.core, s, self.plan_settings, now, self.owners, budgets_read=self.budgets_read()
        )
        self.last_plan = got.plan
        self.metrics.largest_block.set(got.plan.largest_before)
        self._rooms = {f.migration.reservation: f for f in got.inflight}
        self._watched = {k for f in got.inflight for k in (f.migration.pod, *f.replacements)}
        effects: list[Effect] = []
        for action in step(got.migrations, got.plan, self.limits, now, dry_run=s.dry_run, caps=got.caps):
            effects.extend(self._apply(action))
        self.metrics.migrating.set(sum(1 for m in got.migrations if not m.finished(now)))
        if s.dry_run and s.report_config_map:
            effects.append(
                writes.write_report(self.api, self.namespace, s.report_config_map, report(got.plan, now))
            )
        await self.runner.gather(effects)
        return got.plan

    def _apply(self, action: Action) -> list[Effect]:
        """Events and metrics now; API writes as effects the pass awaits together."""
        match action:
            case Event(target, type_, reason, note, why):
                self._event(target, type_, reason, note, why)
            case Count(_, label, by):
                self.metrics.steps.labels(label).inc(by)
            case CreateReservation(move):
                return [self._create(move)]
            case Evict(pod, node, room):
                return [self._evict(pod, node, self._rooms[room])]
            case CloseReservation(migration, reason):
                return [self._close(migration, reason)]
        return []

    async def _create(self, m: Move) -> None:
        entry = self.cache.pods.get(m.key)
        pod = outline_pod(entry) if entry is not None and entry.uid == m.uid else None
        if pod is None:
            return
        ttl = f"{int(self.settings.reserve_timeout + self.settings.window)}s"
        body = writes.reservation_body(m, pod, m.unblocks, ttl)
        if await writes.create_reservation(self.api, body):
            self.metrics.steps.labels("reserved").inc()
            note = f"reserving room on {m.target} ({body['metadata']['name']}) for {m.unblocks}"
            self._event(pod_ref(m.key, m.uid), "Normal", "DefragReserved", note)

    async def _evict(self, pod: ObjectRef, node: str, room: rd.InFlight) -> None:
        entry = self.cache.pods.get(pod.key)
        why = await evict(self.api, Candidate(pod.key, node, entry.priority if entry else 0, "", pod.uid))
        if why:
            self._event(pod, "Warning", "DefragEvictionRefused", why)
            return
        await writes.mark_evicted(self.api, room.migration.reservation, room.uid)
        self.metrics.steps.labels("evicted").inc()
        if entry is not None and entry.uid == pod.uid:
            started = parse_time(entry.started)
            gpus = len(entry.allocations.minors("gpu")) if entry.allocations else 0
            if started is not None:
                self.metrics.gpu_hours.inc(max(0.0, self.wall() - started) * gpus / 3600)
        note = f"evicted; its replacement has room on {room.migration.target}"
        self._event(pod, "Normal", "DefragEvicted", note)

    async def _close(self, m: Migration, reason: str) -> None:
        room = self._rooms.get(m.reservation)
        uid = room.uid if room is not None else ""
        if await writes.close_reservation(self.api, m.reservation, uid, reason, format_time(self.wall())):
            self.metrics.steps.labels("finished").inc()
            if m.pod_present:
                self._event(pod_ref(m.pod, m.uid), "Normal", "DefragGivenUp", f"move to {m.target}: {reason}")

    def _event(self, target: ObjectRef, type_: str, reason: str, note: str, why: str = "Defragment") -> None:
        ref = PodRef(target.namespace, target.name, target.uid)
        with contextlib.suppress(Exception):
            self.events.record(ref, type_, reason, why, note)


def _labelled(obj: JSON | None) -> bool:
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(rd.LABEL) == "true"
