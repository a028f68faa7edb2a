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
  refused with the reason (malformed annotation, devices this node lacks, or the allocator chose
  different ones) and the pod gets a Warning Event; kubelet then fails the pod's admission.
* A pod without an allocation for this node (no annotation, or one whose `allocated-node` names
  another node: on_node.py) gets devices the node chooses among its free ones by topology
  (node_choice.py), offered in GetPreferredAllocation from those kubelet has available; Allocate
  serves kubelet's IDs when the node can serve the pod with exactly those devices, and refuses
  only when it cannot (nothing fits, or a device serves another pod). What the node chose is
  journaled with the served IDs; node_writes.py writes it into the pod's annotation.
* Devices still held by a pod that was served earlier and is not finished are never
  handed out again, through any GPU resource: a GPU served whole (`nvidia.com/gpu`) takes none of
  its shares (`gpu-core`, `koordinator.sh/gpu`) to another pod and the other way round, and the
  shares of one GPU through both share resources add up to 100 at most (kubelet counts the three
  resources apart and would offer them all).

What was served survives a crash: each served container is recorded (`record`, the service's
journal: in the kernel before Allocate answers, so the agent dying cannot lose it, and on disk
milliseconds later), and a restarted agent also adopts what kubelet's PodResources says its pods
hold (`adopt`) before its first answer.

So a container's devices are its annotation's, or the node's choice when it has none for this
node, or it does not start.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from agent.deviceplugin.events import CHOSEN_ON_NODE, NO_EVENTS, REFUSALS, UNNAMED, EventSink
from agent.deviceplugin.expectation import (
    ContainerExpectation,
    ExpectationError,
    container_requests,
    expectations,
)
from agent.deviceplugin.grants import Grant, GrantBuilder
from agent.deviceplugin.identity import Admitting, Unidentified, from_kubelet, pod_key, without_kubelet
from agent.deviceplugin.inventory import (
    GPU_RESOURCES,
    GPU_SHARE_RESOURCES,
    SERVED_RESOURCES,
    UNITS,
    Inventory,
    base_of,
)
from agent.deviceplugin.node_choice import Offered
from agent.deviceplugin.on_node import (
    chosen_expectation,
    node_use,
    offered_units,
    refusal,
    why_node_chooses,
)
from agent.deviceplugin.podresources import KubeletPods, PodResourcesError
from agent.deviceplugin.served import ServedPod
from agent.parts import PodSnapshot, no_snapshot
from apis import resources as rn
from apis.pod_checks import EVENT_REASON, pod_warnings

log = logging.getLogger(__name__)

REFUSED_REASON = "DeviceAllocationRefused"
NAMED_SECONDS = 2.0  # how long GetPreferredAllocation's answer to "which pod" holds for Allocate


class Refused(Exception):
    def __init__(self, message: str, pod: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.pod = pod


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
        record: Callable[[dict[str, Any]], None] = lambda _entry: None,
        pod_cache_seconds: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        node_name: str = "",
        choose_on_node: bool = True,
    ) -> None:
        self.list_pods = list_pods
        self.node_name = node_name
        # pods without an allocation for this node: the node chooses their devices (else refused)
        self.choose_on_node = choose_on_node
        self.kubelet_pods = kubelet_pods  # PodResources List; raises PodResourcesError
        self.grants = grants
        self.events = events
        self.on_served = on_served
        self.record = record  # makes a served container durable before Allocate answers; raises OSError
        self.pod_cache_seconds = pod_cache_seconds
        # the agent's watch of this node's pods: (version, pods), or None while it is not in step
        self.watched_pods: PodSnapshot = no_snapshot  # the agent's pod watch, once attached
        self._watched_version = -1
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
        self.adopted = False  # kubelet's PodResources taken in since this agent started

    @contextlib.contextmanager
    def calls_held(self) -> Iterator[None]:
        """No GetPreferredAllocation or Allocate is answered meanwhile: a PodResources `List` made
        here cannot land inside kubelet's Allocate window (see the module doc)."""
        with self._lock:
            yield

    def served_snapshot(self) -> dict[str, ServedPod]:
        """A copy of `served`; the caller holds `calls_held()`."""
        return {uid: s.copy() for uid, s in self.served.items()}

    # -- pods -------------------------------------------------------------------------------
    def _pod_list(self, fresh: bool) -> list[dict[str, Any]]:
        """This node's pods: from the agent's pod watch when it is in step (no request on the call
        path), else a LIST cached for `pod_cache_seconds`; `fresh` asks the API server itself (a pod
        kubelet names that the watch has not shown yet, a holder that may be gone)."""
        watched = None if fresh else self.watched_pods()
        if watched is not None:
            version, pods = watched
            if version != self._watched_version:
                self._watched_version = version
                # finished pods only: one the watch does not show yet may have just been served
                done = {
                    _uid(p) for p in pods if (p.get("status") or {}).get("phase") in rn.TERMINAL_POD_PHASES
                }
                for uid in done.intersection(self.served):
                    del self.served[uid]
            return pods
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
                    if not self.adopted:
                        self._adopt(kubelet, pods)
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

    def _expectation(
        self, hit: Admitting, resource: str, offered: list[str] | None = None
    ) -> ContainerExpectation:
        """What the container must get: its annotated devices, or those the node chooses for a pod
        without an allocation for this node (among `offered`, kubelet's IDs, when given)."""
        if hit.error:
            raise Refused(f"pod {pod_key(hit.pod)}: {hit.error}", hit.pod)
        uid = _uid(hit.pod)
        why = why_node_chooses(hit.pod, self.node_name, self.served.get(uid)) if self.choose_on_node else ""
        try:
            if not why:
                return expectations(hit.pod, resource, self.inventory)[hit.container]
        except ExpectationError as exc:
            raise Refused(f"pod {pod_key(hit.pod)}: {exc}", hit.pod) from None
        use = node_use(self.inventory, self.served, self._pod_list(False), self.node_name, uid)
        where = (
            None if offered is None else Offered(resource, hit.container, offered_units(resource, offered))
        )
        try:
            return chosen_expectation(
                hit.pod, resource, hit.container, why, self.inventory, use, self.served.get(uid), where
            )
        except ExpectationError as exc:
            given = "" if offered is None else f" (kubelet offered {_summary(resource, offered)})"
            raise Refused(f"pod {pod_key(hit.pod)}: {refusal(why, exc)}{given}", hit.pod) from None

    def _identified(
        self, resource: str, offered: list[str] | None = None
    ) -> tuple[Admitting, ContainerExpectation]:
        """The container kubelet is admitting and what it must get. Raises Refused."""
        hit = self._admitting(resource)
        return hit, self._expectation(hit, resource, offered)

    # -- the two calls ----------------------------------------------------------------------
    def preferred(self, resource: str, available: list[str], must: list[str], size: int) -> list[str]:
        """The annotated IDs of the container being admitted; [] when there are none to prefer
        (Allocate then refuses, with the reason)."""
        with self._lock:
            self._named.pop(resource, None)
            try:
                hit, exp = self._identified(resource, [*must, *available])
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
                # a container the node chooses for: with kubelet's devices, if the node can serve them
                hit, exp = self._named_for(resource, ids) or self._identified(resource, ids)
                if not exp.accepts(resource, ids):
                    chose = "the node can serve it with" if exp.why else "the allocator chose"
                    raise Refused(
                        f"pod {pod_key(hit.pod)}: kubelet asked for {resource} {sorted(ids)}, "
                        f"{chose} {list(exp.bases)}",
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
            raise Refused(
                f"{resource} {sorted(clash)} already serve another pod ({clash_text(clash)})", hit.pod
            )
        try:
            grant = self.grants.build(resource, exp, self.inventory)
        except ExpectationError as exc:
            raise Refused(f"pod {pod_key(hit.pod)}: {exc}", hit.pod) from None
        meta = hit.pod.get("metadata") or {}
        entry: dict[str, Any] = {
            "uid": _uid(hit.pod),
            "namespace": str(meta.get("namespace", "")),
            "name": str(meta.get("name", "")),
            "resource": resource,
            "container": hit.container,
            "ids": list(ids),
        }
        if exp.why:  # the node chose: what it chose goes into the annotation (node_writes.py)
            entry["entries"], entry["why"] = [e.to_dict() for e in exp.entries], exp.why
        try:
            self.record(entry)  # journaled before kubelet hears of it: dying now cannot forget it
        except (OSError, RuntimeError) as exc:
            raise Refused(
                f"pod {pod_key(hit.pod)}: cannot record the served devices: {exc}", hit.pod
            ) from None
        first = entry["uid"] not in self.served
        self.restore(entry)
        log.info("%s %s -> pod %s container %s", resource, ids, pod_key(hit.pod), exp.container)
        if exp.why:
            CHOSEN_ON_NODE.labels(resource).inc()
        warnings = pod_warnings(hit.pod) if first else []
        if warnings:  # what the pod says that topoalloc ignored, once per pod this node serves
            self.events.warn(hit.pod, EVENT_REASON, "; ".join(warnings))
        self.on_served()
        return grant

    def restore(self, entry: dict[str, Any]) -> None:
        """Apply one served-container record (from `_serve`, or a journal after a restart)."""
        served = self.served.setdefault(
            str(entry["uid"]), ServedPod(str(entry.get("namespace", "")), str(entry.get("name", "")))
        )
        served.record(str(entry["resource"]), int(entry["container"]), [str(i) for i in entry["ids"]])
        if "entries" in entry:
            served.chose(
                str(entry["resource"]), int(entry["container"]), list(entry["entries"]), str(entry["why"])
            )

    def adopt(self, kubelet: KubeletPods) -> int:
        """Take in what kubelet's PodResources says this node's unfinished pods hold of the served
        resources (kubelet keeps its assignments across an agent restart); returns how many
        containers were added. Raises Refused when the node's pods cannot be listed."""
        with self._lock:
            return self._adopt(kubelet, self._pod_list(fresh=True))

    def _adopt(self, kubelet: KubeletPods, pods: list[dict[str, Any]]) -> int:
        added = 0
        for pod in pods:
            held = kubelet.get(pod_key(pod))
            if not held or (pod.get("status") or {}).get("phase") in rn.TERMINAL_POD_PHASES:
                continue
            for resource in SERVED_RESOURCES:
                try:
                    requests = container_requests(pod, resource)
                except ExpectationError:
                    continue
                for i, (name, _count) in enumerate(requests):
                    ids = held.get(name, {}).get(resource)
                    if ids and not self._served(pod, resource, i):
                        meta = pod.get("metadata") or {}
                        self.restore(
                            {
                                "uid": _uid(pod),
                                "namespace": meta.get("namespace", ""),
                                "name": meta.get("name", ""),
                                "resource": resource,
                                "container": i,
                                "ids": ids,
                            }
                        )
                        added += 1
        self.adopted = True
        if added:
            log.info("adopted %d containers' devices from kubelet's PodResources", added)
        return added

    def _held_elsewhere(self, resource: str, pod: dict[str, Any], ids: list[str]) -> dict[str, str]:
        """Those of `ids` that an unfinished pod other than `pod` holds, with why: the same ID, or
        for a GPU the same GPU through another GPU resource (whole vs shares, or shares through
        both share resources adding up to more than the GPU)."""
        uid = _uid(pod)
        wanted = set(ids)
        mine: dict[str, int] = {}  # GPU UUID -> how many of my IDs are of it
        gpus: dict[str, str] = {}  # GPU UUID -> one of my IDs of it (the message names that one)
        for i in ids if resource in GPU_RESOURCES else ():
            base = base_of(resource, i)
            mine[base], gpus[base] = mine.get(base, 0) + 1, i
        clash: dict[str, str] = {}
        shared: dict[str, int] = {}  # GPU -> share units other pods hold of it, both share resources
        sharers: dict[str, set[str]] = {}
        for u, s in self.served.items():
            if u == uid:
                continue
            holder = f"{s.namespace}/{s.name}"
            for i in s.held(resource) & wanted:
                clash[i] = holder
            for other in GPU_RESOURCES if gpus else ():
                if other not in s.resources:
                    continue
                both_shares = other in GPU_SHARE_RESOURCES and resource in GPU_SHARE_RESOURCES
                for i in s.held(other):
                    base = base_of(other, i)
                    if base not in gpus:
                        continue
                    if both_shares:
                        shared[base] = shared.get(base, 0) + 1
                        if other != resource:
                            sharers.setdefault(base, set()).add(f"{holder} holds {other} of the same GPU")
                    elif other != resource:
                        clash[gpus[base]] = f"{holder} holds {other} of the same GPU"
        for base, why in sharers.items():
            if shared[base] + mine[base] > UNITS:
                clash[gpus[base]] = "; ".join(sorted(why))
        return clash


def clash_text(clash: dict[str, str]) -> str:
    return "; ".join(sorted(set(clash.values())))


def _summary(resource: str, ids: list[str]) -> str:
    """kubelet's IDs, short: `<base> ×n` per base device."""
    return ", ".join(f"{base} ×{n}" if n > 1 else base for base, n in offered_units(resource, ids).items())
