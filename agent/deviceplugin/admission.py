"""Which pod kubelet is admitting, and whether the devices it asks for are the allocator's choice.

Kubelet's device plugin calls carry device IDs, never the pod. The pod is found among this node's
pods that are bound, Pending, not being deleted and not yet served for the resource, oldest
`creationTimestamp` first (kubelet admits the pods it receives together in that order), then by
namespace/name:

* GetPreferredAllocation steers kubelet to the annotated devices of the first such pod whose next
  container asks for that many IDs and whose annotated devices kubelet still has available.
* Allocate serves the first such pod whose next container's annotated devices are exactly kubelet's
  IDs. None: the call is refused with the reason (missing or malformed annotation, devices this node
  lacks, or the allocator chose different ones) and the oldest pod that fits the request gets a
  Warning Event; kubelet then fails that pod's admission. Devices still held by a pod that was served
  earlier and is not finished are never handed out again.

When two pending pods ask for the same count, kubelet may admit the younger first and receive the
older one's devices; each then runs on devices the allocator chose for this node, and the PodResources
cross-check (crosscheck.py) rewrites both annotations to what kubelet really assigned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.deviceplugin.events import REFUSALS
from agent.deviceplugin.expectation import (
    ContainerExpectation,
    ExpectationError,
    container_requests,
    expectations,
)
from agent.deviceplugin.grants import Grant, GrantBuilder
from agent.deviceplugin.inventory import Inventory
from apis import resources as rn

log = logging.getLogger(__name__)

REFUSED_REASON = "DeviceAllocationRefused"


class EventSink(Protocol):
    def warn(self, pod: dict[str, Any], reason: str, message: str) -> None: ...


class Refused(Exception):
    def __init__(self, message: str, pod: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.pod = pod


@dataclass
class ServedPod:
    namespace: str
    name: str
    # resource -> kubelet IDs per served container, in container order
    resources: dict[str, list[list[str]]] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "resources": self.resources}

    @classmethod
    def from_wire(cls, data: Any) -> ServedPod:
        if not isinstance(data, dict):
            raise ValueError("served pod entry is not a map")
        res = data.get("resources") or {}
        if not isinstance(res, dict) or not all(
            isinstance(v, list) and all(isinstance(ids, list) for ids in v) for v in res.values()
        ):
            raise ValueError("served pod resources are not lists of ID lists")
        return cls(
            str(data.get("namespace", "")), str(data.get("name", "")), {str(k): v for k, v in res.items()}
        )


def pod_key(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _uid(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))


def _pending(pod: dict[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    return phase == "Pending" and not meta.get("deletionTimestamp")


def _order(pod: dict[str, Any]) -> tuple[str, str, str]:
    meta = pod.get("metadata") or {}
    return (str(meta.get("creationTimestamp", "")), str(meta.get("namespace", "")), str(meta.get("name", "")))


@dataclass
class _Candidate:
    pod: dict[str, Any]
    container: int  # index among the containers requesting the resource
    count: int
    expectation: ContainerExpectation | None
    error: str = ""


class Admission:
    def __init__(
        self,
        *,
        list_pods: Callable[[], list[dict[str, Any]]],
        grants: GrantBuilder,
        events: EventSink | None = None,
        on_served: Callable[[], None] | None = None,
        pod_cache_seconds: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.list_pods = list_pods
        self.grants = grants
        self.events = events
        self.on_served = on_served
        self.pod_cache_seconds = pod_cache_seconds
        self.clock = clock
        self.inventory = Inventory()
        self.served: dict[str, ServedPod] = {}  # pod uid ->
        self._lock = threading.RLock()  # re-entered by on_served -> served_snapshot
        self._pods: list[dict[str, Any]] = []
        self._pods_at = float("-inf")
        self.refusals = 0

    def served_snapshot(self) -> dict[str, ServedPod]:
        with self._lock:
            return {
                uid: ServedPod(
                    s.namespace, s.name, {r: [list(ids) for ids in v] for r, v in s.resources.items()}
                )
                for uid, s in self.served.items()
            }

    # -- pods -------------------------------------------------------------------------------
    def _pod_list(self, fresh: bool) -> list[dict[str, Any]]:
        if fresh or self.clock() - self._pods_at > self.pod_cache_seconds:
            pods = self.list_pods()
            self._pods, self._pods_at = pods, self.clock()
            live = {
                _uid(p) for p in pods if (p.get("status") or {}).get("phase") not in rn.TERMINAL_POD_PHASES
            }
            for uid in [u for u in self.served if u not in live]:
                del self.served[uid]  # finished or deleted: its devices are free again
        return self._pods

    def _candidates(self, resource: str, pods: list[dict[str, Any]]) -> Iterator[_Candidate]:
        """Pending pods with a container not yet served `resource`, oldest first; each annotation is
        read only when the caller gets that far."""
        for pod in sorted((p for p in pods if _pending(p)), key=_order):
            served = self.served.get(_uid(pod))
            done = len(served.resources.get(resource, [])) if served else 0
            try:
                requests = container_requests(pod, resource)
            except ExpectationError as exc:
                yield _Candidate(pod, 0, 0, None, str(exc))
                continue
            if done >= len(requests):
                continue
            count = requests[done][1]
            try:
                exps = expectations(pod, resource, self.inventory)
                yield _Candidate(pod, done, count, exps[done])
            except ExpectationError as exc:
                yield _Candidate(pod, done, count, None, str(exc))

    # -- the two calls ----------------------------------------------------------------------
    def preferred(self, resource: str, available: list[str], must: list[str], size: int) -> list[str]:
        """The annotated IDs for the pod being admitted; [] when no pod fits (Allocate then refuses)."""
        with self._lock:
            for fresh in (False, True):
                try:
                    pods = self._pod_list(fresh)
                except Refused as exc:
                    log.warning("GetPreferredAllocation %s: %s", resource, exc)
                    return []
                for cand in self._candidates(resource, pods):
                    if cand.expectation is None or cand.count != size:
                        continue
                    chosen = cand.expectation.choose(resource, available, must)
                    if chosen is not None:
                        return chosen
        return []

    def allocate(self, resource: str, ids: list[str]) -> Grant:
        """Serve the pod whose annotation names exactly `ids`, or raise Refused."""
        with self._lock:
            pods: list[dict[str, Any]] = []
            refusal: Refused | None = None
            for fresh in (False, True):
                try:
                    pods = self._pod_list(fresh)
                except Refused as exc:
                    refusal = exc
                    break
                match = next(
                    (
                        c
                        for c in self._candidates(resource, pods)
                        if c.expectation is not None and c.expectation.accepts(resource, ids)
                    ),
                    None,
                )
                if match is not None:
                    try:
                        return self._serve(resource, match, ids)
                    except Refused as exc:
                        refusal = exc
                        break
            if refusal is None:
                refusal = self._refusal(resource, ids, list(self._candidates(resource, pods)))
        self.refusals += 1
        REFUSALS.labels(resource).inc()
        if refusal.pod is not None and self.events is not None:
            self.events.warn(refusal.pod, REFUSED_REASON, str(refusal))
        raise refusal

    def _serve(self, resource: str, cand: _Candidate, ids: list[str]) -> Grant:
        exp = cand.expectation
        assert exp is not None
        clash = self._held_elsewhere(resource, cand.pod, ids)
        if clash:
            self._pod_list(fresh=True)  # the holder may have finished since the cached list
            clash = self._held_elsewhere(resource, cand.pod, ids)
        if clash:
            raise Refused(f"{resource} {clash} already serve another pod", cand.pod)
        try:
            grant = self.grants.build(resource, exp, self.inventory)
        except ExpectationError as exc:
            raise Refused(f"pod {pod_key(cand.pod)}: {exc}", cand.pod) from None
        meta = cand.pod.get("metadata") or {}
        served = self.served.setdefault(
            _uid(cand.pod), ServedPod(str(meta.get("namespace", "")), str(meta.get("name", "")))
        )
        served.resources.setdefault(resource, []).append(list(ids))
        log.info("%s %s -> pod %s container %s", resource, ids, pod_key(cand.pod), exp.container)
        if self.on_served is not None:
            self.on_served()
        return grant

    def _held_elsewhere(self, resource: str, pod: dict[str, Any], ids: list[str]) -> list[str]:
        """Those of `ids` that an unfinished pod other than `pod` was served."""
        uid = _uid(pod)
        held = {
            i
            for u, s in self.served.items()
            if u != uid
            for got in s.resources.get(resource, [])
            for i in got
        }
        return sorted(held.intersection(ids))

    def _refusal(self, resource: str, ids: list[str], cands: list[_Candidate]) -> Refused:
        fitting = [c for c in cands if c.count == len(ids) or (c.expectation is None and c.count == 0)]
        if not fitting:
            return Refused(f"no pending pod on this node requests {len(ids)} {resource}")
        cand = fitting[0]
        who = f"pod {pod_key(cand.pod)}"
        if cand.expectation is None:
            return Refused(f"{who}: {cand.error}", cand.pod)
        return Refused(
            f"{who}: kubelet asked for {resource} {sorted(ids)}, "
            f"the allocator chose {list(cand.expectation.bases)}",
            cand.pod,
        )
