"""The claims controller (leader only): runs the core's claims lifecycle on the controller runner and
carries out what it decides.

The decisions are the core's (allocator/core/claims/lifecycle.py: gate, allocate, ungate; move the
claims of a pod kube-scheduler refused where they are; release claims nothing uses); this module
only acts. The keys of the runner's queue are the keys of pending pods that name ResourceClaims:
a pod's change, or a change of a claim it names, wakes it; a change of what claims are placed
against (Nodes, Devices, slices, templates) asks for a full pass over every pending pod (those
waiting out a retry's pause for reasons of their own are left to it), a DeviceClass's change wakes
every pending pod. Each pass builds the view of the pods it looks at (allocator/claims/
pod_claims.py), steps the lifecycle, which places and holds synchronously, one pod (or gang) after
another, so two pods never get the same device, and carries out its actions: Events and the
runner's retries at once, writes as tasks on the runner (up to `concurrency` at once, a pod's key
busy meanwhile, allocator/claims/write_tasks.py) whose answers go back to the pod's next step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from allocator.claims.cache_view import ClaimsCache
from allocator.claims.decide import HOLDER, Decider
from allocator.claims.holders import ClaimHolders
from allocator.claims.pod_claims import pending_pod
from allocator.claims.race import RACE, Repairs
from allocator.claims.write_tasks import ClaimWrites, record
from allocator.core.actions import Event, Forget, Retry
from allocator.core.claims.lifecycle import (
    Action,
    ClaimsLifecycle,
    ClaimsLifecycleSettings,
    MoveClaims,
    ReleaseClaim,
    WriteAllocation,
)
from allocator.core.claims.taints import TaintNotices
from allocator.core.claims.view import ClaimsView, Outcome, PendingPod
from allocator.core.request.usage import claim_usage_key
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.dra_settings import DraSettings
from allocator.runtime.events import EventSink
from allocator.runtime.kube import KubeApi
from allocator.runtime.runner import Batch, ControllerMetrics, Runner, RunnerSettings
from allocator.runtime.topology import Topology
from allocator.runtime.workqueue import Backoff
from apis.dra_claims import claim_name, pod_claims
from apis.errors import CodecError
from apis.resources import TERMINAL_POD_PHASES

log = logging.getLogger(__name__)

JSON = dict[str, Any]
PLACED_AGAINST = ("ResourceClaimTemplate", "ResourceSlice", "Node", "Device")


def runner_settings(settings: DraSettings) -> RunnerSettings:
    return RunnerSettings(
        resync=settings.resync_period,
        batch_delay=settings.batch_delay,
        concurrency=settings.concurrency,
        backoff=Backoff(settings.retry_initial, settings.retry_max),
    )


class ClaimsController:
    def __init__(
        self,
        *,
        api: KubeApi,
        cache: ClaimsCache,
        core: CoreAdapter,
        settings: DraSettings,
        events: EventSink,
        is_leader: Callable[[], bool],
        synced: Callable[[], bool],
        topology_keys: Sequence[str] = (),
        topology: Topology | None = None,
        metrics: ControllerMetrics | None = None,
        registry: CollectorRegistry | None = None,
        namespace: str = "topoalloc-system",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache = cache
        self.events = events
        self.decider = Decider(cache, core, topology_keys, topology)
        self.lifecycle = ClaimsLifecycle(
            self.decider, ClaimsLifecycleSettings(settings.reallocate_after, settings.release_after)
        )
        self.writes = ClaimWrites(api, events, self.decider, self._tell)
        self.taints = TaintNotices()  # Events on claims whose devices turned tainted
        self.runner = Runner(
            "claims",
            self,
            runner_settings(settings),
            is_leader=is_leader,
            synced=synced,
            metrics=metrics,
            clock=clock,
        )
        self.pending: set[str] = set()  # pod keys: unbound pods that name resource claims
        self._claims_of: dict[str, set[str]] = {}  # pod key -> the claims it names
        self._by_claim: dict[str, set[str]] = {}  # claim key -> the pending pods naming it
        self._outcomes: dict[str, Outcome] = {}  # pod key -> its writes' answer, for its next step
        self.holders = ClaimHolders(self._capacity)  # which claims hold each device
        self.repairs = Repairs(
            cache,
            self.holders,
            events=events,
            runner=self.runner,
            writes=self.writes,
            decider=self.decider,
            pods_naming=self.pods_naming,
            registry=registry,
            namespace=namespace,
        )

    def _capacity(self, device: tuple[str, str]) -> dict[str, int] | None:
        """A published device's capacities in whole units (None: not published)."""
        pool, name = device
        published = self.cache.dra.published.get(pool)
        found = published.devices.get(name) if published is not None and published.pool == pool else None
        return None if found is None else {n: c.value.value() for n, c in found.capacities.items()}

    # -- what the cache tells ----------------------------------------------------------------------

    def observe(self, kind: str, key: str, obj: JSON | None) -> None:
        if kind == "Pod":
            self._observe_pod(key, obj)
        elif kind == "ResourceClaim":
            contested = self.holders.update(key, obj)
            if self.repairs.check(key) or contested:
                self.runner.wake(RACE)  # a device in two claims, a pod bound elsewhere: repaired next
            self.runner.wake_all(self._by_claim.get(key, ()))
        elif kind == "DeviceClass":
            self.runner.wake_all(self.pending)  # what a claim was refused for may have changed
        elif kind in PLACED_AGAINST:
            if kind == "Node":
                self.decider.nodes_changed()
            self.runner.resync()

    def _observe_pod(self, key: str, obj: JSON | None) -> None:
        for claim in self._claims_of.pop(key, ()):
            pods = self._by_claim.get(claim)
            if pods is not None:
                pods.discard(key)
                if not pods:
                    del self._by_claim[claim]
        spec = (obj or {}).get("spec") or {}
        finished = ((obj or {}).get("status") or {}).get("phase") in TERMINAL_POD_PHASES
        if obj is None or not spec.get("resourceClaims") or spec.get("nodeName") or finished:
            if spec.get("nodeName") and spec.get("resourceClaims") and not finished:
                self._check_bound(key, obj)
            if key in self.pending:
                self.pending.discard(key)
                self._outcomes.pop(key, None)
                self.lifecycle.gone(key)
                self.runner.forget(key)
            return
        self.pending.add(key)
        namespace = (obj.get("metadata") or {}).get("namespace") or "default"
        try:
            claims = {f"{namespace}/{n}" for ref in pod_claims(obj) if (n := claim_name(ref))}
        except CodecError:
            claims = set()
        self._claims_of[key] = claims
        for claim in claims:
            self._by_claim.setdefault(claim, set()).add(key)
        self.runner.wake(key)

    def _check_bound(self, key: str, obj: JSON) -> None:
        """A pod bound: is a claim of its, moved meanwhile, on another node?"""
        namespace = key.partition("/")[0]
        try:
            names = [n for ref in pod_claims(obj) if (n := claim_name(ref))]
        except CodecError:
            return
        if any([self.repairs.check(f"{namespace}/{n}") for n in names]):
            self.runner.wake(RACE)

    def pods_naming(self, claim: str) -> set[str]:
        """The pending pods that name the claim."""
        return set(self._by_claim.get(claim, ()))

    def _tell(self, key: str, outcome: Outcome) -> None:
        """A write task's answer: the pod's next step hears it (woken once its writes end)."""
        self._outcomes[key] = outcome
        self.runner.wake(key)

    # -- a pass ----------------------------------------------------------------------------------

    async def reconcile(self, batch: Batch) -> None:
        pods: list[PendingPod] = []
        for key in batch.select(self.pending):
            if self.runner.waiting(key):
                continue  # a full pass: it waits out its retry's pause, nothing of it changed
            entry = self.cache.pods.get(key)
            outcome = self._outcomes.pop(key, None)
            pod = pending_pod(entry, self.cache, outcome, self.holders.rivals) if entry is not None else None
            if pod is not None:
                pods.append(pod)
        claims = [e.claim for e in self.cache.dra.claims.values() if e.claim] if batch.full else []
        view = ClaimsView(pods, batch.full, claims, self._by_claim, self.cache.ledger.holds)
        for action in self.lifecycle.step(view, batch.now):
            self._apply(action)
        if batch.full:
            for event in self.taints.step(claims, self.cache.dra.published):
                record(self.events, event)
        repairs = self.repairs
        if (
            self.holders.contested
            or repairs.done
            or repairs.misplaced
            or self.holders.dropped
            or self.holders.announcing
        ):
            self.repairs.run()

    def _apply(self, action: Action) -> None:
        match action:
            case Event():
                record(self.events, action)
            case Retry(key):
                self.runner.retry(key)
            case Forget(key):
                self.runner.forget(key)
            case WriteAllocation(pods):
                self.runner.spawn([p.member.key for p in pods], self.writes.write(action))
            case MoveClaims(_, placed):
                self.runner.spawn([placed.member.key], self.writes.move(action))
            case ReleaseClaim(claim) if not self.runner.busy(key := claim_usage_key(claim.key)):
                self.runner.spawn([key], self.writes.release(claim))

    def step_down(self) -> None:
        """Leadership lost: hold nothing (writes in flight finish: their claims are the next
        leader's to see) and look at every pending pod afresh when leading again."""
        self.decider.drop([k for k, hold in self.cache.ledger.holds.items() if hold.holder == HOLDER])
        self.lifecycle.reset()
        self.runner.wake_all(self.pending)
