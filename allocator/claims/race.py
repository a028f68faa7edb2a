"""Repairing a device found in two claims (allocator/core/claims/race.py decides): the claims
holding each contested device read from the cache with the pods that name or reserve them, and
what the core decides carried out on the controller's runner, each claim acted on once.

kube-scheduler counts allocated devices in a set: when one of two claims holding a device lets it
go (moved, deallocated, deleted), it counts the device free while the other claim still holds it,
and would hand it out again. Such a device is announced again: a claim of the allocator's own, in
its namespace and used by no pod, is allocated with it after the drop (deallocated first and
allocated again when it exists), and deleted once no claim holds the device.

A bound pod whose claim topoalloc allocated and reserved for it selects another node (a
scheduling attempt of kube-scheduler's that began before the claim moved binds the pod to the old
node without writing the claim) is looked at when the claim or the pod changes: evicted through
its controller, or, without one, left with an Event (allocator/core/claims/race.py `misplaced`).

The metric `topoalloc_dra_double_booked_total{outcome}` counts the claims repaired: moved (topoalloc's,
allocated again), cleared (kube-scheduler's, deallocated for it to allocate again), evicted (a bound
pod's, made again by its controller) and stuck (a bound pod without a controller: only its Event
says so), a pod bound away from its claim's node counted the same way; and the devices announced
again (announced).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from allocator.claims.cache_view import ClaimsCache
from allocator.claims.decide import Decider
from allocator.claims.holders import ClaimHolders
from allocator.claims.pod_claims import gates
from allocator.claims.write_tasks import ClaimWrites, record
from allocator.claims.writes import clear_allocation, evict, write_allocation
from allocator.core.actions import Count, Event, Evict, ObjectRef
from allocator.core.claims.lifecycle import MoveClaims, Placed, allocated
from allocator.core.claims.race import ACTION, ClearClaim, Holder, HolderPod, MoveClaim, misplaced, repair
from allocator.core.claims.view import Member
from allocator.core.request.usage import claim_usage_key
from allocator.runtime.events import EventSink
from allocator.runtime.kube import ApiError
from allocator.runtime.runner import Runner
from apis import dra
from apis.dra_claims import DeviceResult, ResourceClaim
from apis.kinds import RESOURCECLAIMS

JSON = dict[str, Any]

log = logging.getLogger(__name__)


REQUEST = "device"
RACE = "race:"  # the controller's key for a pass that looks at contested devices (no pod's)


def announcing_claim(namespace: str, pool: str, device: str) -> JSON:
    """The claim holding `device` of `pool` in kube-scheduler's count (no pod uses it)."""
    kind = "rdma-vf" if "-vf-" in device else device.split("-")[0]
    classes = {"gpu": dra.GPU_CLASS, "rdma": dra.RDMA_CLASS, "rdma-vf": dra.RDMA_VF_CLASS}
    cls = classes.get(kind, dra.GPU_CLASS)
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"topoalloc-announces-{pool}-{device}"[:253],
            "namespace": namespace,
            "annotations": {dra.ANNOUNCES_ANNOTATION: f"{pool}/{device}"},
        },
        "spec": {"devices": {"requests": [{"name": REQUEST, "exactly": {"deviceClassName": cls}}]}},
    }


class Repairs:
    def __init__(
        self,
        cache: ClaimsCache,
        holders: ClaimHolders,
        *,
        events: EventSink,
        runner: Runner,
        writes: ClaimWrites,
        decider: Decider,
        pods_naming: Callable[[str], set[str]],
        registry: CollectorRegistry | None,
        namespace: str = "topoalloc-system",
    ) -> None:
        self.namespace = namespace  # where the claims announcing a device are made
        self.cache, self.holders, self.events, self.runner = cache, holders, events, runner
        self.writes, self.decider, self.pods_naming = writes, decider, pods_naming
        self.done: dict[str, int] = {}  # claim key -> the `since` it was acted on at
        self.misplaced: set[str] = set()  # claims whose pod may be bound to another node
        self.acted: dict[str, tuple[str, str]] = {}  # pod key -> (uid, claim's node) acted on
        self.counter = Counter(
            "topoalloc_dra_double_booked",
            "Claims found holding a device another claim held first, by what became of them.",
            ["outcome"],
            registry=registry,
        )

    def run(self) -> None:
        holders = self.holders
        seen: set[str] = set()
        for pool, name in sorted(holders.contested):
            group = [h for key in holders.holders((pool, name)) if (h := self._holder(key)) is not None]
            seen.update(h.claim.key for h in group)
            done = {h.claim.key for h in group if self.done.get(h.claim.key) == holders.since(h.claim.key)}
            for action in repair(f"{pool}/{name}", group, done, holders.capacity((pool, name))):
                self._apply(action, group)
        self.done = {k: v for k, v in self.done.items() if k in seen}
        self._repair_misplaced()
        self._announce_all()

    # -- a bound pod whose claim is on another node -----------------------------------------------

    def check(self, key: str) -> bool:
        """Whether the claim, as the cache shows it now, is reserved for a pod bound to another node
        than its allocation's (kept to be repaired on the next pass)."""
        entry = self.cache.dra.claims.get(key)
        if entry is None or not self._bound_elsewhere(entry.claim):
            return False
        self.misplaced.add(key)
        return True

    def _bound_elsewhere(self, claim: ResourceClaim | None) -> list[tuple[HolderPod, str]]:
        """The claim's reserving pods, bound and live, that the core finds on a node the claim's
        allocation does not select (`misplaced`), each with that node."""
        if claim is None or claim.allocation is None:
            return []
        out = []
        for consumer in claim.reserved_for:
            key = f"{claim.namespace}/{consumer.name}"
            pod = self.cache.pods.get(key) if consumer.resource == "pods" else None
            if pod is None or pod.uid != consumer.uid or not pod.active or pod.deleting:
                continue
            ref = ObjectRef(claim.namespace, consumer.name, pod.uid)
            holder = HolderPod(key, ref, bool(pod.node), False, pod.owner)
            if misplaced(claim, holder, pod.node):
                out.append((holder, pod.node))
        return out

    def _repair_misplaced(self) -> None:
        for key in sorted(self.misplaced):
            entry = self.cache.dra.claims.get(key)
            claim = entry.claim if entry is not None else None
            found = self._bound_elsewhere(claim)
            if claim is None or claim.allocation is None or not found:
                self.misplaced.discard(key)
                continue
            for pod, node in found:
                mark = (pod.ref.uid, claim.allocation.node)
                if self.acted.get(pod.key) == mark or self.runner.busy(f"evict:{pod.key}"):
                    continue
                tried = pod.key in self.acted  # an eviction refused before: no second Event
                self.acted[pod.key] = mark
                for action in misplaced(claim, pod, node):
                    if isinstance(action, Evict):
                        self.runner.spawn([f"evict:{pod.key}"], self._evict_misplaced(action.pod, pod.key))
                    elif not tried:
                        self._apply(action, [])
        self.acted = {k: v for k, v in self.acted.items() if k in self.cache.pods}

    async def _evict_misplaced(self, ref: ObjectRef, key: str) -> None:
        why = await evict(self.writes.api, ref.namespace, ref.name, ref.uid)
        if why:  # a budget allows no disruption now: tried again after a pause
            log.info("evicting %s (bound away from its claim's node): %s", key, why)
            self.acted[key] = ("", "")
            self.runner.retry(RACE)

    # -- kube-scheduler's count of a device another claim still holds -----------------------------

    def _announce_all(self) -> None:
        """A device dropped from kube-scheduler's count while a claim still holds it is announced
        again (a claim of ours allocated with it, after the drop); an announcing claim whose device
        nothing holds any more goes."""
        holders = self.holders
        for device in sorted(holders.dropped - holders.contested):
            key = f"announce:{device[0]}/{device[1]}"
            if self.runner.busy(key):
                continue
            holders.dropped.discard(device)
            if holders.held(device):
                self.runner.spawn([key], self._announce(device))
        for device, (claim_key, _) in sorted(holders.announcing.items()):
            key = f"announce:{device[0]}/{device[1]}"
            if not holders.held(device) and not self.runner.busy(key):
                self.runner.spawn([key], self._unannounce(claim_key))

    async def _announce(self, device: tuple[str, str]) -> None:
        pool, name = device
        found = self.holders.announcing.get(device)
        entry = self.cache.dra.claims.get(found[0]) if found is not None else None
        claim = entry.claim if entry is not None else None
        try:
            if claim is None:
                body = announcing_claim(self.namespace, pool, name)
                path = RESOURCECLAIMS.path(namespace=self.namespace)
                made = (await self.writes.api.create(path, body, what=None)).or_raise()
                claim = ResourceClaim.from_dict(made.object)
            rv = claim.resource_version
            if claim.allocation is not None:  # out, then in again: kube-scheduler adds on the way in
                rv = await clear_allocation(self.writes.api, claim, rv)
            result = DeviceResult(REQUEST, dra.DRIVER, pool, name)
            await write_allocation(self.writes.api, claim, rv, (result,), pool)
            self.counter.labels("announced").inc()
        except ApiError as exc:
            log.warning("announcing device %s/%s to kube-scheduler: %s", pool, name, exc)
            self.holders.dropped.add(device)  # tried again on the next pass

    async def _unannounce(self, key: str) -> None:
        namespace, _, name = key.partition("/")
        path = RESOURCECLAIMS.path(name, namespace=namespace)
        with contextlib.suppress(ApiError):
            await self.writes.api.raw("DELETE", path)

    def _holder(self, key: str) -> Holder | None:
        entry = self.cache.dra.claims.get(key)
        claim = entry.claim if entry is not None else None
        if claim is None or claim.allocation is None:
            return None
        pods: dict[str, HolderPod] = {}
        names = {f"{claim.namespace}/{r.name}" for r in claim.reserved_for if r.resource == "pods"}
        for pod_key in sorted(names | self.pods_naming(key)):
            found = self.cache.pods.get(pod_key)
            if found is None:
                continue
            raw = found.raw or {}
            namespace, _, name = pod_key.partition("/")
            gated = dra.SCHEDULING_GATE in gates(raw) if raw else False
            ref = ObjectRef(namespace, name, found.uid)
            pods[pod_key] = HolderPod(pod_key, ref, bool(found.node), gated, found.owner)
        return Holder(claim, self.holders.since(key), tuple(pods.values()))

    def _apply(self, action: object, group: list[Holder]) -> None:
        match action:
            case Event():
                record(self.events, action)
            case Count(_, label, by):
                self.counter.labels(label).inc(by)
            case ClearClaim(claim):
                self._done(claim)
                self.runner.spawn([claim_usage_key(claim.key)], self._clear(claim))
            case MoveClaim(claim, pod):
                self._done(claim)
                self._move(claim, pod)
            case Evict(ref, _, owner):
                mine = [h.claim for h in group if any(p.key == owner for p in h.pods)]
                for claim in mine:
                    self._done(claim)
                self.runner.spawn([f"evict:{owner}"], self._evict(ref, [c.key for c in mine]))

    def _done(self, claim: ResourceClaim) -> None:
        self.done[claim.key] = self.holders.since(claim.key)

    async def _clear(self, claim: ResourceClaim) -> None:
        try:
            await clear_allocation(self.writes.api, claim, claim.resource_version)
        except Exception as exc:  # the next pass sees the claim as it is then
            log.warning("deallocating claim %s (a device in two claims): %s", claim.key, exc)
            self.done.pop(claim.key, None)
            self.runner.wake(RACE)

    def _move(self, claim: ResourceClaim, pod: HolderPod) -> None:
        entry = self.cache.pods.get(pod.key)
        raw = entry.raw if entry is not None else None
        if raw is None:
            return
        member = Member(pod.key, raw, [replace(claim, allocation=None)])
        decided = self.decider.place([member])
        if isinstance(decided, str):
            note = f"claim {claim.key} is in a device another claim holds and cannot move: {decided}"
            record(self.events, Event(pod.ref, "Warning", "DRAReallocationFailed", note, ACTION))
            self.done.pop(claim.key, None)
            return
        (answer,) = decided
        written = Event(pod.ref, "Normal", "DRAAllocated", allocated(answer), ACTION)
        move = MoveClaims((claim,), Placed(member, answer, written))
        self.runner.spawn([pod.key], self._moved(claim, move))

    async def _moved(self, claim: ResourceClaim, move: MoveClaims) -> None:
        await self.writes.move(move)
        # Moved, its devices changed; refused (kube-scheduler reserved it meanwhile), it is weighed
        # again as it is now.
        self.done.pop(claim.key, None)
        self.runner.wake(RACE)

    async def _evict(self, ref: ObjectRef, claims: list[str]) -> None:
        why = await evict(self.writes.api, ref.namespace, ref.name, ref.uid)
        if why:  # tried again on a later pass
            log.info("evicting %s/%s (a device in two claims): %s", ref.namespace, ref.name, why)
            for key in claims:
                self.done.pop(key, None)
