"""The claims controller (leader only): gate, allocate, ungate; re-allocate; release.

Every pass (woken by the watch cache, batched, and at least every `resyncPeriod`), per pending pod
that names ResourceClaims:

1. Gated (`topoalloc.io/dra`): once every claim exists, the claims topoalloc allocates are placed
   together by the core (the node and the devices, pinned to the node of claims already allocated),
   held in the hold ledger, each marked `topoalloc.io/allocated-by` and its status.allocation
   written (results and a node selector), then the gate is removed; kube-scheduler binds at its
   own speed. A claim that cannot be allocated as written, or a pod that fits nowhere now, stays
   gated and holds nothing; an Event says why, and the pod is tried again with a growing pause
   (at once when it changes). A write that fails rolls back the claims already written: nothing
   is left half-allocated.
2. Ungated but not bound, with PodScheduled=False/Unschedulable while claims topoalloc allocated
   for it are not reserved: kube-scheduler could not place it on their node after all (another
   filter). They are deallocated and allocated elsewhere at once, the failed node left out, with an
   Event (clear and write are back to back; in between kube-scheduler's own allocator could act,
   and then its allocation stands and counts).
Then claims topoalloc allocated that nothing uses any more (not reserved, no pending pod names
them, not made for a pod) are deallocated after `releaseAfter`.

Decisions (place and hold) run synchronously, one pod after another, so two pods never get the same
device; the writes of up to `concurrency` pods run at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from allocator.claims.cache_view import ClaimsCache
from allocator.claims.decide import HOLDER, Decider, Member
from allocator.claims.pod_claims import PodClaims, resolve
from allocator.claims.writes import clear_allocation, mark, remove_gate, write_allocation
from allocator.core.claims.solve import ClaimAnswer
from allocator.core.request.usage import claim_usage_key
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.dra_settings import DraSettings
from allocator.runtime.events import EventSink, PodRef
from allocator.runtime.kube import ApiError, KubeApi
from apis import dra
from apis.dra_claims import ResourceClaim, claim_name, pod_claims
from apis.errors import CodecError
from apis.gang_object import read_gang_object
from apis.podgroup import KOORDINATOR_SOURCE, NATIVE_SOURCE, PODGROUP_SOURCE, WORKLOAD_SOURCE, gang_of
from apis.resources import TERMINAL_POD_PHASES

log = logging.getLogger(__name__)

JSON = dict[str, Any]
ACTION = "Allocating"


@dataclass
class _Retry:
    uid: str
    at: float  # monotonic time of the next try
    pause: float
    seen: tuple[Any, ...] = ()  # what the pod and its claims looked like at the last try


@dataclass
class _Moved:
    """A pod whose claims were re-allocated: the nodes kube-scheduler refused, and the reason it
    gave at the time (another re-allocation waits for a new reason or `reallocateAfter`)."""

    uid: str
    refused: set[str] = field(default_factory=set)
    message: str = ""
    at: float = 0.0


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.cache = cache
        self.core = core
        self.settings = settings
        self.events = events
        self.is_leader = is_leader
        self.synced = synced
        self.clock = clock
        self.decider = Decider(cache, core, topology_keys)
        self.pending: set[str] = set()  # pod keys: unbound pods that name resource claims
        self.passes = 0
        self.allocated = 0  # pods whose claims this process allocated (tests, benchmarks)
        self._wake = asyncio.Event()
        self._busy: set[str] = set()  # pods whose writes are in flight
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(max(1, settings.concurrency))
        self._retry: dict[str, _Retry] = {}
        self._moved: dict[str, _Moved] = {}
        self._unused: dict[str, float] = {}  # claim key -> when first seen allocated by us and unused
        self._leading = False
        # What a pass looks at: the pods that changed (or whose claims did), or every pending pod
        # after a change of the nodes, slices or classes (and at every resync).
        self._dirty: set[str] = set()
        self._rescan = True
        self._claims_of: dict[str, set[str]] = {}  # pod key -> the claims it names
        self._by_claim: dict[str, set[str]] = {}  # claim key -> the pending pods naming it
        self._last_release = -math.inf

    # -- what the cache tells ----------------------------------------------------------------------

    def observe(self, kind: str, key: str, obj: JSON | None) -> None:
        """The cache's changes: a pod (or a claim it names) changed looks at that pod again; a
        change of what claims are placed against (Nodes, Devices, slices, classes, templates)
        looks at every pending pod again."""
        if kind == "Pod":
            self._observe_pod(key, obj)
        elif kind == "ResourceClaim":
            self._dirty.update(self._by_claim.get(key, ()))
        elif kind in ("ResourceClaimTemplate", "DeviceClass", "ResourceSlice", "Node", "Device"):
            self._rescan = True
            if kind == "Node":
                self.decider.nodes_changed()
        else:
            return
        self._wake.set()

    def _observe_pod(self, key: str, obj: JSON | None) -> None:
        for claim in self._claims_of.pop(key, ()):
            pods = self._by_claim.get(claim)
            if pods is not None:
                pods.discard(key)
                if not pods:
                    del self._by_claim[claim]
        spec = (obj or {}).get("spec") or {}
        phase = ((obj or {}).get("status") or {}).get("phase")
        if (
            obj is None
            or not spec.get("resourceClaims")
            or spec.get("nodeName")
            or phase in TERMINAL_POD_PHASES
        ):
            self.pending.discard(key)
            self._dirty.discard(key)
            self._retry.pop(key, None)
            self._moved.pop(key, None)
            return
        self.pending.add(key)
        self._dirty.add(key)
        namespace = (obj.get("metadata") or {}).get("namespace") or "default"
        try:
            claims = {f"{namespace}/{n}" for ref in pod_claims(obj) if (n := claim_name(ref))}
        except CodecError:
            claims = set()
        self._claims_of[key] = claims
        for claim in claims:
            self._by_claim.setdefault(claim, set()).add(key)

    def wake(self) -> None:
        self._wake.set()

    # -- loop --------------------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.settings.resync_period):
                    await self._wake.wait()
                await asyncio.sleep(self.settings.batch_delay)
            except TimeoutError:
                self._rescan = True  # a full pass now and then: nothing waits on a lost event
            self._wake.clear()
            if not (self.is_leader() and self.synced()):
                if self._leading:
                    self.step_down()
                continue
            self._leading = True
            try:
                self.reconcile_all()
            except Exception:  # a bug in one pass must not stop claim allocation for good
                log.exception("claims controller pass failed")

    def step_down(self) -> None:
        """Leadership lost: hold nothing; writes in flight finish (their claims are the new
        leader's to see)."""
        busy = {claim_usage_key(k) for k in self._busy}
        self.decider.drop(
            [k for k, r in self.cache.ledger.holds.items() if r.holder == HOLDER and k not in busy]
        )
        self._retry.clear()
        self._moved.clear()
        self._unused.clear()
        self._rescan = True
        self._leading = False

    async def drain(self) -> None:
        """Wait for the writes in flight (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def reconcile_all(self) -> None:
        self.passes += 1
        now = self.clock()
        next_at = math.inf
        gangs: dict[str, list[tuple[str, JSON, PodClaims]]] = {}
        due = {k for k, r in self._retry.items() if r.at <= now}
        keys = self.pending if self._rescan else (self._dirty | due) & self.pending
        rescanned, self._rescan = self._rescan, False
        self._dirty.clear()
        for key in sorted(keys):
            entry = self.cache.pods.get(key)
            pod = entry.raw if entry is not None else None
            if pod is None or entry is None or entry.node or entry.deleting or key in self._busy:
                continue
            retry = self._retry.get(key)
            waiting = retry is not None and retry.uid == entry.uid and retry.at > now
            if retry is not None and waiting and retry.seen == self._fingerprint(key):
                next_at = min(next_at, retry.at)
                continue
            gated = dra.SCHEDULING_GATE in _gates(pod)
            if not gated and _unschedulable(pod) is None:
                continue  # on its way: kube-scheduler binds it
            claims = resolve(pod, self.cache.dra)
            if not gated:
                self._ungated(key, pod, claims, now)
            elif entry.gang and claims.todo and not claims.pinned:
                gangs.setdefault(entry.gang, []).append((key, pod, claims))
            else:
                self._gated([(key, pod, claims)], now)
        for gang, members in sorted(gangs.items()):
            self._gated(members, now, gang=gang)
        if rescanned or now - self._last_release >= self.settings.resync_period:
            self._last_release = now
            self._release_unused(set(self._by_claim), now)
        next_at = min([next_at, *(r.at for k, r in self._retry.items() if k in self.pending and r.at > now)])
        if next_at < math.inf:
            asyncio.get_running_loop().call_at(
                asyncio.get_running_loop().time() + max(0.0, next_at - now), self._wake.set
            )

    # -- 1. gated pods --------------------------------------------------------------------------------

    def _gated(self, pods: list[tuple[str, JSON, PodClaims]], now: float, *, gang: str = "") -> None:
        """Allocate the claims of `pods` (one pod, or the pending members of `gang`) all at once."""
        for key, pod, claims in pods:
            if claims.waiting:
                log.debug("pod %s waits: %s", key, claims.waiting)
                return  # kube-controller-manager makes the claims; their events wake us
            if claims.refused:
                self.events.warn(PodRef.of(pod), "DRAClaimRefused", ACTION, claims.refused)
                self._backoff([(key, pod)], now)
                return
        todo = [Member(key, pod, claims.todo, claims.pinned) for key, pod, claims in pods if claims.todo]
        for key, pod, claims in pods:
            if not claims.todo:
                note = "; ".join(claims.left) if claims.left else "its claims are allocated"
                self._spawn([key], self._ungate(key, pod, note))
        if not todo:
            return
        if gang and len(todo) < (need := self._gang_size(gang, todo[0].pod)):
            log.debug("gang %s: %d of %d members with claims to allocate", gang, len(todo), need)
            return
        decided = self.decider.decide(todo)
        if isinstance(decided, str):
            log.debug("%s: claims not allocated: %s", gang or todo[0].key, decided)
            for m in todo:
                note = f"gang {gang}: {decided}" if gang else decided
                self.events.warn(PodRef.of(m.pod), "DRAAllocationFailed", ACTION, note)
            self._backoff([(m.key, m.pod) for m in todo], now)
            return
        log.debug("%s: claims go to %s", gang or todo[0].key, ", ".join(sorted({a.node for a in decided})))
        for m in todo:
            self._retry.pop(m.key, None)
        self._spawn([m.key for m in todo], self._allocate(todo, decided, ungate=True))

    def _gang_size(self, gang: str, pod: JSON) -> int:
        """How many members the gang waits for: its object's minimum (either PodGroup, a Workload's
        pod group), or Koordinator's min-available (a Koordinator gang without one: the members
        there are)."""
        try:
            ref = gang_of(pod)
        except CodecError:
            ref = None
        if ref is None or ref.key != gang:
            return 1 << 30  # the pod no longer names this gang: the next pass sees it as it is
        if ref.source == KOORDINATOR_SOURCE:
            return ref.min_available or 1  # without min-available: the members there are
        stores = {
            PODGROUP_SOURCE: self.cache.podgroups,
            NATIVE_SOURCE: self.cache.native_podgroups,
            WORKLOAD_SOURCE: self.cache.workloads,
        }
        found, _, _ = read_gang_object(ref, stores)
        return found.min_member if found is not None else 1 << 30  # its object is not there (yet)

    async def _allocate(self, members: list[Member], answers: list[ClaimAnswer], *, ungate: bool) -> None:
        """Write every member's claims (marked, then their allocation), then remove the gates; a
        failure rolls back every claim already written: all of them or none."""
        written: list[tuple[ResourceClaim, str]] = []
        try:
            for m, answer in zip(members, answers, strict=True):
                for claim in m.todo:
                    rv = await mark(self.api, claim, claim.resource_version)
                    rv = await write_allocation(self.api, claim, rv, answer.results[claim.key], answer.node)
                    written.append((claim, rv))
        except ApiError as exc:
            for claim, rv in written:
                try:
                    await clear_allocation(self.api, claim, rv)
                except ApiError as undo:
                    log.warning("rolling back the allocation of claim %s: %s", claim.key, undo)
            self.decider.drop_members(members)
            for m in members:
                note = f"writing the claims' allocation: {exc}"
                self.events.warn(PodRef.of(m.pod), "DRAAllocationFailed", ACTION, note)
            self._backoff([(m.key, m.pod) for m in members], self.clock())
            return
        for m, answer in zip(members, answers, strict=True):
            self.allocated += 1
            devices = "; ".join(f"{k}: {', '.join(r.device for r in rs)}" for k, rs in answer.results.items())
            note = f"claims allocated on {answer.node} ({devices})"
            self.events.record(PodRef.of(m.pod), "Normal", "DRAAllocated", ACTION, note)
        if ungate:
            await asyncio.gather(*(self._ungate(m.key, m.pod, "") for m in members))

    async def _ungate(self, key: str, pod: JSON, note: str) -> None:
        meta = pod.get("metadata") or {}
        namespace, name = meta.get("namespace") or "default", meta.get("name") or ""
        ok = await remove_gate(self.api, namespace, name, meta.get("uid") or "", _gates(pod))
        if ok and note:
            self.events.record(PodRef.of(pod), "Normal", "DRALeftToKubeScheduler", ACTION, note)
        if not ok:
            self._backoff([(key, pod)], self.clock())

    # -- 2. ungated, refused where its claims are -----------------------------------------------------

    def _ungated(self, key: str, pod: JSON, claims: PodClaims, now: float) -> None:
        message = _unschedulable(pod)
        if message is None or claims.refused:
            return
        ours = [c for c in claims.allocated if c.allocated_by_us and not c.reserved_for]
        if not ours or len(ours) != len(claims.allocated) or claims.todo:
            log.debug("pod %s is unschedulable; its claims are not topoalloc's to move", key)
            return  # not ours to move (or other claims pin the pod): kube-scheduler's to report
        uid = (pod.get("metadata") or {}).get("uid") or ""
        moved = self._moved.get(key)
        if moved is None or moved.uid != uid:
            moved = self._moved[key] = _Moved(uid)
        elif moved.message == message and now - moved.at < self.settings.reallocate_after:
            return
        node = claims.pinned
        moved.refused.add(node)
        moved.message, moved.at = message, now
        # What the pod can be placed against: these claims as if unallocated.
        member = Member(key, pod, [replace(c, allocation=None) for c in ours])
        decided = self.decider.decide([member], frozenset(moved.refused))
        ref = PodRef.of(pod)
        if isinstance(decided, str):
            note = f"kube-scheduler refused {node}: {decided}"
            self.events.warn(ref, "DRAReallocationFailed", ACTION, note)
            return
        note = (
            f"kube-scheduler could not place the pod on {node} ({message}); claims moved to {decided[0].node}"
        )
        self.events.warn(ref, "DRAReallocated", ACTION, note)
        self._spawn([key], self._move(member, ours, decided[0]))

    async def _move(self, member: Member, ours: list[ResourceClaim], answer: ClaimAnswer) -> None:
        cleared = []
        try:
            for claim in ours:
                rv = await clear_allocation(self.api, claim, claim.resource_version)
                cleared.append(replace(claim, resource_version=rv, allocation=None))
        except ApiError as exc:
            log.warning("deallocating the claims of %s: %s", member.key, exc)
            self.decider.drop_members([member])
            return
        await self._allocate([replace(member, todo=cleared)], [answer], ungate=False)

    # -- release --------------------------------------------------------------------------------------

    def _release_unused(self, referenced: set[str], now: float) -> None:
        holds = self.cache.ledger.holds
        unused = set()
        for key, entry in self.cache.dra.claims.items():
            c = entry.claim
            if c is None or not c.allocated_by_us or c.reserved_for or c.deleting or c.owner_pod:
                continue
            if key in referenced or claim_usage_key(key) in holds:
                continue
            unused.add(key)
            first = self._unused.setdefault(key, now)
            if now - first >= self.settings.release_after and key not in self._busy:
                self._spawn([key], self._release(c))
        for key in [k for k in self._unused if k not in unused]:
            del self._unused[key]

    async def _release(self, claim: ResourceClaim) -> None:
        try:
            await clear_allocation(self.api, claim, claim.resource_version)
            log.info("claim %s deallocated: nothing uses it", claim.key)
        except ApiError as exc:
            log.warning("deallocating unused claim %s: %s", claim.key, exc)
        self._unused.pop(claim.key, None)

    # -- helpers -----------------------------------------------------------------------------------------

    def _spawn(self, keys: list[str], coro: Any) -> None:
        self._busy.update(keys)

        async def run() -> None:
            try:
                async with self._slots:
                    await coro
            except Exception:
                log.exception("claims controller: writes of %s failed", ", ".join(keys))
            finally:
                self._busy.difference_update(keys)
                self._wake.set()

        task = asyncio.get_running_loop().create_task(run(), name=f"claims {keys[0]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _fingerprint(self, key: str) -> tuple[Any, ...]:
        """What a retry waits to change: the pod's version and its claims' versions."""
        entry = self.cache.pods.get(key)
        pod = entry.raw if entry is not None else None
        if pod is None:
            return ()
        meta = pod.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        try:
            names = [claim_name(ref) for ref in pod_claims(pod)]
        except CodecError:
            names = []
        versions = []
        for name in names:
            entry = self.cache.dra.claims.get(f"{namespace}/{name}") if name else None
            versions.append(entry.claim.resource_version if entry is not None and entry.claim else "")
        classes = len(self.cache.dra.classes)
        return (meta.get("resourceVersion"), tuple(versions), classes)

    def _backoff(self, pods: list[tuple[str, JSON]], now: float) -> None:
        for key, pod in pods:
            uid = (pod.get("metadata") or {}).get("uid") or ""
            old = self._retry.get(key)
            pause = self.settings.retry_initial
            if old is not None and old.uid == uid:
                pause = min(old.pause * 2, self.settings.retry_max)
            self._retry[key] = _Retry(uid, now + pause, pause, self._fingerprint(key))


def _gates(pod: JSON) -> list[str]:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return [g.get("name", "") for g in gates if isinstance(g, dict)]


def _unschedulable(pod: JSON) -> str | None:
    """kube-scheduler's message when it found no node for the pod (None otherwise)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            return str(cond.get("message") or "")
    return None
