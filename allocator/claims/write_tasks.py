"""The claims controller's write tasks, each spawned on the runner (allocator/claims/controller.py)
for one action of the claims lifecycle: the claims of a pod (or a gang) written all or none, each
allocated and reserved for its pod in one write (the gates go in a later step, once the cache shows
the writes); a pod's gate removed; a move (clear allocation and reservation, then write elsewhere);
a release. The API calls are writes.py's. What the API answers goes back to
the pods' next steps through `tell` (an `Outcome`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace

from allocator.claims.decide import Decider
from allocator.claims.pod_claims import gates
from allocator.claims.writes import clear_allocation, mark, remove_gate, write_allocation
from allocator.core.actions import Event
from allocator.core.claims.lifecycle import MoveClaims, Placed, WriteAllocation
from allocator.core.claims.view import Outcome
from allocator.runtime.events import EventSink, PodRef
from allocator.runtime.kube import ApiError, KubeApi
from apis import dra
from apis.dra_claims import ResourceClaim

log = logging.getLogger(__name__)

Tell = Callable[[str, Outcome], None]


def record(events: EventSink, event: Event) -> None:
    t = event.target
    ref = PodRef(t.namespace, t.name, t.uid, t.kind, t.api_version)
    events.record(ref, event.type, event.reason, event.action, event.note)


class ClaimWrites:
    def __init__(self, api: KubeApi, events: EventSink, decider: Decider, tell: Tell) -> None:
        self.api = api
        self.events = events
        self.decider = decider
        self.tell = tell

    async def write(self, action: WriteAllocation) -> None:
        """Every pod's claims (marked unless the admission webhook marked them, then their
        allocation and reservation for the pod), then, with `ungate`, the gates; a failure rolls
        back every claim already written: all of them or none."""
        written: list[tuple[ResourceClaim, str]] = []
        try:
            for p in action.pods:
                for claim in p.member.todo:
                    assert p.answer is not None
                    rv = claim.resource_version
                    if claim.annotation(dra.ALLOCATED_BY_ANNOTATION) != dra.ALLOCATED_BY:
                        rv = await mark(self.api, claim, rv)  # the admission webhook did not mark it
                    results = p.answer.results[claim.key]
                    # Reserved for the pod in the same write: kube-scheduler's PreBind then
                    # writes nothing for the claim.
                    node = p.answer.node
                    rv = await write_allocation(self.api, claim, rv, results, node, p.member.pod)
                    written.append((claim, rv))
        except ApiError as exc:
            for claim, rv in written:
                try:
                    await clear_allocation(self.api, claim, rv)
                except ApiError as undo:
                    log.warning("rolling back the allocation of claim %s: %s", claim.key, undo)
            self.decider.drop_members([p.member for p in action.pods])
            for p in action.pods:
                self.tell(p.member.key, Outcome(failed=str(exc)))
            return
        versions = {claim.key: rv for claim, rv in written}
        for p in action.pods:
            if p.written is not None:
                record(self.events, p.written)
            if p.member.todo:
                mine = tuple((c.key, versions[c.key]) for c in p.member.todo)
                self.tell(p.member.key, Outcome(written=mine))
        if action.ungate:
            await asyncio.gather(*(self._ungate(p) for p in action.pods))

    async def _ungate(self, placed: Placed) -> None:
        pod = placed.member.pod
        meta = pod.get("metadata") or {}
        namespace, name = meta.get("namespace") or "default", meta.get("name") or ""
        ok = await remove_gate(self.api, namespace, name, meta.get("uid") or "", gates(pod))
        if ok and placed.ungated is not None:
            record(self.events, placed.ungated)
        self.tell(placed.member.key, Outcome(ungated=True) if ok else Outcome(gate_refused=True))

    async def move(self, action: MoveClaims) -> None:
        """Clear the claims' allocation, then write them where the lifecycle placed them."""
        member = action.placed.member
        cleared = []
        try:
            for claim in action.claims:
                rv = await clear_allocation(self.api, claim, claim.resource_version)
                cleared.append(replace(claim, resource_version=rv, allocation=None))
        except ApiError as exc:
            log.warning("deallocating the claims of %s: %s", member.key, exc)
            self.decider.drop_members([member])
            return
        moved = replace(action.placed, member=replace(member, todo=cleared))
        await self.write(WriteAllocation((moved,), ungate=False))

    async def release(self, claim: ResourceClaim) -> None:
        try:
            await clear_allocation(self.api, claim, claim.resource_version)
            log.info("claim %s deallocated: nothing uses it", claim.key)
        except ApiError as exc:
            log.warning("deallocating unused claim %s: %s", claim.key, exc)
