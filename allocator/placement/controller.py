"""The placement controller (leader only): runs the core's placement lifecycle on the runner and
carries out what it decides (allocator/core/placement/lifecycle.py).

Keys are pod keys: a placement pod's change wakes its own key; a change that may make room (a Node
or Device, a bound pod gone) wakes the pods that fit nowhere, so a waiting pod is tried again at
once rather than at its next retry. Decisions (and their holds) run in the pass, one pod after
another, so two pods never get the same device; the writes of up to `concurrency` pods run at once,
each pod's key busy until its writes are answered, and the answers go back to its next step.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from allocator.core.actions import Count, Event, Evict, Forget, ObjectRef, Requeue, Retry, WriteStatus
from allocator.core.gang.victims import Candidate
from allocator.core.placement.lifecycle import (
    BindPlacement,
    ClearPlacement,
    PlacementLifecycle,
    PlacementLifecycleSettings,
    Replace,
    WritePlacement,
)
from allocator.core.placement.view import Outcome, PlacementView
from allocator.placement.cache_view import PlacementCache
from allocator.placement.door import HOLDER, ClusterDoor
from allocator.placement.metrics import PlacementMetrics
from allocator.placement.pending import pending_pod, placement_pod
from allocator.placement.writes import clear_placement, pin_of, write_condition, write_placement
from allocator.runtime.events import EventSink, PodRef
from allocator.runtime.evictions import evict
from allocator.runtime.kube import ApiError, KubeApi
from allocator.runtime.placement_settings import PlacementSettings
from allocator.runtime.runner import Batch, ControllerMetrics, Runner, RunnerSettings
from allocator.runtime.workqueue import Backoff
from apis import keys

log = logging.getLogger(__name__)
JSON = dict[str, Any]
RECORDED = (keys.DEVICE_ALLOCATED, keys.ALLOCATED_NODE)


class PlacementController:
    def __init__(
        self,
        *,
        api: KubeApi,
        cache: PlacementCache,
        door: ClusterDoor,
        settings: PlacementSettings,
        events: EventSink,
        metrics: PlacementMetrics,
        is_leader: Callable[[], bool],
        synced: Callable[[], bool],
        controller_metrics: ControllerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api, self.cache, self.door, self.events, self.metrics = api, cache, door, events, metrics
        self.pin = settings.pin
        self.bind_for = tuple(settings.bind_for)
        self.lifecycle = PlacementLifecycle(door, PlacementLifecycleSettings(preemption=settings.preemption))
        self.runner = Runner(
            "placement",
            self,
            RunnerSettings(
                resync=settings.resync_period,
                batch_delay=settings.batch_delay,
                concurrency=settings.concurrency,
                backoff=Backoff(settings.retry_initial, settings.retry_max),
            ),
            is_leader=is_leader,
            synced=synced,
            metrics=controller_metrics,
            clock=clock,
        )
        self.pending: set[str] = set()  # pod keys placement looks after
        self.unplaced: set[str] = set()  # those that fit nowhere at their last look
        # Placed pods whose devices this process does not hold yet (placed by another leader, or
        # before a restart): no decision at admission until a pass has held them again.
        self.unheld: set[str] = set()
        self.clock = clock
        self._outcomes: dict[str, Outcome] = {}

    # -- what the cache tells ----------------------------------------------------------------------

    def observe(self, kind: str, key: str, obj: JSON | None) -> None:
        if kind == "Pod":
            if placement_pod(obj, self.bind_for):
                self.pending.add(key)
                self._unheld(key, obj)
                self.runner.wake(key)
                return
            if key in self.pending:
                self.pending.discard(key)
                self.unheld.discard(key)
                self.unplaced.discard(key)
                self.runner.queue.remove(key)
                self.lifecycle.forget([key])
            if obj is None:
                self.lifecycle.victims_gone([key])
            if obj is None or (obj.get("spec") or {}).get("nodeName"):
                self._room_may_have_freed()  # a bound pod gone (or one bound: nothing freed, cheap)
        elif kind in ("Node", "Device"):
            if kind == "Node":
                self.door.nodes_changed()
            self._room_may_have_freed()

    def _unheld(self, key: str, obj: JSON | None) -> None:
        annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
        if keys.ALLOCATED_NODE in annotations and not self.door.held(key):
            self.unheld.add(key)
        else:
            self.unheld.discard(key)

    def admitting(self) -> bool:
        """Whether a pod may be placed at admission now: this process leads, its cache is synced
        and every placed pod's devices are held here (a new leader's pass holds them again first;
        with none to hold, it need not wait for its first pass)."""
        return self.runner.is_leader() and self.runner.synced() and not self.unheld

    def refused_by(self, controller: str) -> frozenset[str]:
        """The nodes a pod of `controller` (uid) keeps off (kube-scheduler refused its siblings)."""
        return self.lifecycle.refused_by(controller, self.clock())

    def _room_may_have_freed(self) -> None:
        if self.unplaced:
            self.runner.wake_all(self.unplaced)

    # -- a pass ------------------------------------------------------------------------------------

    async def reconcile(self, batch: Batch) -> None:
        pods = []
        for key in batch.select(self.pending):
            entry = self.cache.pods.get(key)
            pod = pending_pod(entry, self.bind_for) if entry is not None else None
            if pod is not None:
                pods.append(pod)
        outcomes = {p.key: self._outcomes.pop(p.key) for p in pods if p.key in self._outcomes}
        for action in self.lifecycle.step(PlacementView(pods, outcomes, batch.full), batch.now):
            self._apply(action)
        for pod in pods:
            if pod.key in self.unheld:
                self._unheld(pod.key, self._raw(pod.key))

    def _apply(self, action: Any) -> None:
        match action:
            case WritePlacement(pod, node, annotations, ungate):
                raw = self._raw(pod.key)
                pin = pin_of(raw, self.pin)
                self.runner.spawn([pod.key], self._write(raw, pod, node, annotations, ungate, pin))
            case BindPlacement(pod, node, annotations):
                self.runner.spawn([pod.key], self._bind(pod, node, annotations))
            case Replace(pod, _):
                self.runner.spawn([pod.key], self._evict(pod, ""))
            case ClearPlacement(pod):
                self.door.release(pod.key)
                self.runner.spawn([pod.key], self._clear(self._raw(pod.key), pod))
            case Event(target, type_, reason, note, verb):
                with contextlib.suppress(Exception):
                    self.events.record(
                        PodRef(target.namespace, target.name, target.uid), type_, reason, verb, note
                    )
            case Evict(victim, node, _):
                self.runner.spawn([f"evict:{victim.key}"], self._evict(victim, node))
            case WriteStatus(target, status, _):
                self.runner.spawn([f"status:{target.key}"], self._status(target, status))
            case Count(metric, label, by):
                self.metrics.count(metric, label, by)
            case Requeue(key, after):
                self.runner.after(key, after)
            case Retry(key):
                self.runner.retry(key)
                self.unplaced.add(key)
            case Forget(key):
                self.runner.forget(key)
                self.unplaced.discard(key)

    def _raw(self, key: str) -> JSON:
        entry = self.cache.pods.get(key)
        return (entry.raw if entry is not None else None) or {}

    async def _write(
        self, raw: JSON, pod: ObjectRef, node: str, annotations: dict[str, str], ungate: bool, pin: str
    ) -> None:
        started = time.perf_counter()
        got = await write_placement(self.api, raw, pod, node, annotations, ungate=ungate, pin=pin)
        self._outcomes[pod.key] = Outcome(written=bool(got), refused="" if got else str(got))
        if got:
            self.metrics.write_seconds.observe(time.perf_counter() - started)

    async def _bind(self, pod: ObjectRef, node: str, annotations: dict[str, str]) -> None:
        try:
            await self.api.bind_pod(pod.namespace, pod.name, pod.uid, node, annotations=annotations)
        except ApiError as exc:
            self._outcomes[pod.key] = Outcome(refused=str(exc))
            return
        self._outcomes[pod.key] = Outcome(written=True)

    async def _clear(self, raw: JSON, pod: ObjectRef) -> None:
        await clear_placement(self.api, raw, pod, RECORDED)

    async def _evict(self, victim: ObjectRef, node: str) -> None:
        why = await evict(self.api, Candidate(victim.key, node, 0, "", victim.uid))
        if why:
            log.info("evicting %s to make room: %s (tried again on the next look)", victim.key, why)

    async def _status(self, target: ObjectRef, status: JSON) -> None:
        await write_condition(self.api, target, status)

    def wake(self) -> None:
        self.runner.wake()

    def step_down(self) -> None:
        """Leadership lost: hold nothing; the next leader holds again what pods record."""
        for key, hold in list(self.cache.ledger.holds.items()):
            if hold.holder == HOLDER:
                self.cache.ledger.drop_hold(key, force=True)
        self.lifecycle = PlacementLifecycle(self.door, self.lifecycle.settings)
        self._outcomes.clear()
        self.unplaced.clear()
        for key in self.pending:
            self._unheld(key, self._raw(key))
        self.runner.wake_all(self.pending)
