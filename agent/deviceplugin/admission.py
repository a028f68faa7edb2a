"""Serving kubelet's device plugin calls for the pod it is admitting, or refusing them.

identity.py names the pod and container kubelet is admitting from kubelet's PodResources list,
read in GetPreferredAllocation and kept for the Allocate that follows it (kubelet admits one
container at a time and calls GetPreferredAllocation, then Allocate). An Allocate with no such
GetPreferredAllocation before it (kubelet skips it when its Topology Manager leaves exactly the
devices needed) reads the list itself. Not reading it while kubelet holds devices in flight keeps
clear of a kubelet race (kubernetes/kubernetes#137534: a PodResources `List` during an `Allocate`
can drop that reservation and let the next pod be offered the same devices). Then:

* GetPreferredAllocation steers kubelet to that container's annotated devices, taken from those
  kubelet still has available.
* Allocate serves it when kubelet's IDs are exactly its annotated devices. Otherwise the call is
  refused with the reason (missing or malformed annotation, devices this node lacks, or the
  allocator chose different ones) and the pod gets a Warning Event; kubelet then fails the pod's
  admission. Devices still held by a pod that was served earlier and is not finished are never
  handed out again.

So a container's devices are its annotation's, or it does not start.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agent.deviceplugin.events import NO_EVENTS, REFUSALS, UNNAMED, EventSink
from agent.deviceplugin.expectation import ContainerExpectation, ExpectationError, expectations
from agent.deviceplugin.grants import Grant, GrantBuilder
from agent.deviceplugin.identity import Admitting, Unidentified, from_kubelet, pod_key, without_kubelet
from agent.deviceplugin.inventory import Inventory
from agent.deviceplugin.podresources import KubeletPods, PodResourcesError
from apis import resources as rn

log = logging.getLogger(__name__)

REFUSED_REASON = "DeviceAllocationRefused"
NAMED_SECONDS = 2.0  # how long GetPreferredAllocation's answer to "which pod" holds for Allocate


class Refused(Exception):
    def __init__(self, message: str, pod: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.pod = pod


@dataclass
class ServedPod:
    namespace: str
    name: str
    # resource -> kubelet IDs per container requesting it, in container order ([] not served yet)
    resources: dict[str, list[list[str]]] = field(default_factory=dict)

    def served(self, resource: str, container: int) -> bool:
        got = self.resources.get(resource, [])
        return container < len(got) and bool(got[container])

    def record(self, resource: str, container: int, ids: list[str]) -> None:
        got = self.resources.setdefault(resource, [])
        got.extend([] for _ in range(container + 1 - len(got)))
        got[container] = list(ids)

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


def _uid(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))


class Admission:
    def __init__(
        self,
        *,
        list_pods: Callable[[], list[dict[str, Any]]],
        grants: GrantBuilder,
        kubelet_pods: Callable[[], KubeletPods] | None = None,
        events: EventSink = NO_EVENTS,
        on_served: Callable[[], None] = lambda: None,
        pod_cache_seconds: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.list_pods = list_pods
        self.kubelet_pods = kubelet_pods  # PodResources List; raises PodResourcesError
        self.grants = grants
        self.events = events
        self.on_served = on_served
        self.pod_cache_seconds = pod_cache_seconds
        self.clock = clock
        self.inventory = Inventory()
        self.served: dict[str, ServedPod] = {}  # pod uid ->
        self._lock = threading.Lock()
        self._pods: list[dict[str, Any]] = []
        self._pods_at = float("-inf")
        self.refusals = 0
        self.unidentified_fallbacks = 0  # calls named without PodResources
        # resource -> the container GetPreferredAllocation named, what it must get, and when
        self._named: dict[str, tuple[Admitting, ContainerExpectation, float]] = {}

    @contextlib.contextmanager
    def calls_held(self) -> Iterator[None]:
        """No GetPreferredAllocation or Allocate is answered meanwhile: a PodResources `List` made
        here cannot land inside kubelet's Allocate window (see the module doc)."""
        with self._lock:
            yield

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

    def _served(self, pod: dict[str, Any], resource: str, container: int) -> bool:
        got = self.served.get(_uid(pod))
        return got is not None and got.served(resource, container)

    def _admitting(self, resource: str) -> Admitting:
        """The container kubelet is admitting now. Raises Refused."""
        kubelet: KubeletPods | None = None
        why = "no PodResources socket configured"
        if self.kubelet_pods is not None:
            try:
                kubelet = self.kubelet_pods()
            except PodResourcesError as exc:
                why = str(exc)
        last: Unidentified | None = None
        for fresh in (False, True):  # a pod kubelet names may be newer than the cached list
            pods = self._pod_list(fresh)
            try:
                if kubelet is not None:
                    return from_kubelet(resource, kubelet, pods)
                hit = without_kubelet(resource, pods, lambda p, i: self._served(p, resource, i), why)
                self.unidentified_fallbacks += 1
                UNNAMED.labels(resource).inc()
                log.warning("%s: pod named without PodResources (%s)", resource, why)
                return hit
            except Unidentified as exc:
                last = exc
        assert last is not None
        raise Refused(str(last))

    def _expectation(self, hit: Admitting, resource: str) -> ContainerExpectation:
        if hit.error:
            raise Refused(f"pod {pod_key(hit.pod)}: {hit.error}", hit.pod)
        try:
            return expectations(hit.pod, resource, self.inventory)[hit.container]
        except ExpectationError as exc:
            raise Refused(f"pod {pod_key(hit.pod)}: {exc}", hit.pod) from None

    def _identified(self, resource: str) -> tuple[Admitting, ContainerExpectation]:
        """The container kubelet is admitting and what it must get. Raises Refused."""
        hit = self._admitting(resource)
        return hit, self._expectation(hit, resource)

    # -- the two calls ----------------------------------------------------------------------
    def preferred(self, resource: str, available: list[str], must: list[str], size: int) -> list[str]:
        """The annotated IDs of the container being admitted; [] when there are none to prefer
        (Allocate then refuses, with the reason)."""
        with self._lock:
            self._named.pop(resource, None)
            try:
                hit, exp = self._identified(resource)
            except Refused as exc:
                log.warning("GetPreferredAllocation %s: %s", resource, exc)
                return []
            self._named[resource] = (hit, exp, self.clock())
            if exp.count != size:
                return []
            return exp.choose(resource, available, must) or []

    def _named_for(self, resource: str, ids: list[str]) -> tuple[Admitting, ContainerExpectation] | None:
        """The container GetPreferredAllocation just named for this Allocate, if it still fits: named
        a moment ago, not served since, and `ids` are its annotated devices (otherwise the caller asks
        kubelet again rather than blame a pod from a stale answer)."""
        named = self._named.pop(resource, None)
        if named is None:
            return None
        hit, exp, at = named
        if self.clock() - at > NAMED_SECONDS or self._served(hit.pod, resource, hit.container):
            return None
        return (hit, exp) if exp.accepts(resource, ids) else None

    def allocate(self, resource: str, ids: list[str]) -> Grant:
        """Serve the container being admitted if `ids` are its annotated devices, or raise Refused."""
        try:
            with self._lock:
                hit, exp = self._named_for(resource, ids) or self._identified(resource)
                if not exp.accepts(resource, ids):
                    raise Refused(
                        f"pod {pod_key(hit.pod)}: kubelet asked for {resource} {sorted(ids)}, "
                        f"the allocator chose {list(exp.bases)}",
                        hit.pod,
                    )
                return self._serve(resource, hit, exp, ids)
        except Refused as refusal:
            self.refusals += 1
            REFUSALS.labels(resource).inc()
            if refusal.pod is not None:
                self.events.warn(refusal.pod, REFUSED_REASON, str(refusal))
            raise

    def _serve(self, resource: str, hit: Admitting, exp: ContainerExpectation, ids: list[str]) -> Grant:
        clash = self._held_elsewhere(resource, hit.pod, ids)
        if clash:
            self._pod_list(fresh=True)  # the holder may have finished since the cached list
            clash = self._held_elsewhere(resource, hit.pod, ids)
        if clash:
            raise Refused(f"{resource} {clash} already serve another pod", hit.pod)
        try:
            grant = self.grants.build(resource, exp, self.inventory)
        except ExpectationError as exc:
            raise Refused(f"pod {pod_key(hit.pod)}: {exc}", hit.pod) from None
        meta = hit.pod.get("metadata") or {}
        served = self.served.setdefault(
            _uid(hit.pod), ServedPod(str(meta.get("namespace", "")), str(meta.get("name", "")))
        )
        served.record(resource, hit.container, ids)
        log.info("%s %s -> pod %s container %s", resource, ids, pod_key(hit.pod), exp.container)
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
