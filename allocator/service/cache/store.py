"""The watch cache: raw Nodes, Pods, Devices and PodGroups, fed incrementally into the allocator
core's cluster state, plus the bind path's reservations ("assumed" pods).

Who holds devices:
  * a pod with `spec.nodeName` that has not terminated holds what its `device-allocated`
    annotation says (this is how a restart rebuilds every allocation: the first LIST replays
    every bound pod);
  * a reservation holds what bind chose, from the moment of choice until the watch shows the pod
    bound (it becomes the pod's own entry), the bind fails (rolled back) or the TTL passes.
A pod that carries the annotation but is not bound holds nothing: the annotation was written by a
bind that did not finish, and kube-scheduler will call bind again.

Gang scheduling adds *planned* reservations (`reserve_planned`): the devices of a gang member,
held from the moment its gang was planned until the member shows up bound or the gang controller
releases them. Bind then takes the planned devices on the planned node only, and a gang member
without a plan is not bound at all (`gang_guard`). `listeners` hear of every change the cache
takes in, so the gang controller wakes up instead of polling.

All methods are synchronous and the service runs one event loop: a method runs to completion
before any other request or watch event is looked at, so choose-and-reserve in `reserve()` is a
critical section without a lock, and as short as the core's `allocate()`.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import sys
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from allocator.service.coreadapter import (
    NOT_IN_CACHE,
    CoreAdapter,
    FilterVerdicts,
    PodRequest,
    PodUsage,
    Rejection,
)
from allocator.service.kube import DEVICES, NODES, PODGROUPS, PODS, Kind
from allocator.service.metrics import Metrics
from apis import keys
from apis.annotations import DeviceAllocations
from apis.resources import TERMINAL_POD_PHASES

log = logging.getLogger(__name__)

JSON = dict[str, Any]
# What the core counts for a pod: (node, reservation token or 0, the pod's usage or None)
Assigned = tuple[str, int, "PodUsage | None"]


def pod_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def _meta(obj: JSON) -> JSON:
    return obj.get("metadata") or {}


@dataclass
class PodEntry:
    """What the cache keeps of a pod: what it holds where."""

    key: str
    uid: str
    node: str  # spec.nodeName, "" while pending
    active: bool  # not in a terminal phase
    annotation: str | None  # device-allocated, verbatim
    usage: PodUsage | None  # the core's reading (devices, cpu/memory), only while it holds
    containers: bytes  # a digest of spec.containers, to notice a resize
    # The whole object only while the pod waits for a node (bind reads it); a cluster's bound
    # pods would otherwise keep hundreds of megabytes of managedFields and status alive.
    raw: JSON | None

    @property
    def holds(self) -> bool:
        return bool(self.node) and self.active

    @property
    def allocations(self) -> DeviceAllocations | None:
        return self.usage.allocations if self.usage is not None else None


@dataclass
class Reservation:
    token: int
    key: str
    uid: str
    node: str
    allocations: DeviceAllocations
    annotation: str  # allocations as the device-allocated JSON that bind writes
    request: PodRequest
    expires: float
    gang: str = ""  # the gang whose plan holds this; such a hold ends when bound or released by it
    binding: bool = False  # a bind of a planned member is under way


GANG_PLAN = "topoalloc: gang plan"
# (kind name, object key, the object, or None once deleted)
Listener = Callable[[str, str, "JSON | None"], None]


class ClusterCache:
    def __init__(
        self,
        core: CoreAdapter,
        *,
        reservation_ttl: float = 120.0,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self.reservation_ttl = reservation_ttl
        self.metrics = metrics
        self.clock = clock
        # Of a Node only what the allocator reads: a real Node is mostly status that changes often.
        self.nodes: dict[str, NodeFacts] = {}
        # Of a Device its resourceVersion and itself as compressed JSON (2-3 KB instead of a
        # 25-80 KB dict), decoded again only for a Node that is deleted and created again.
        self.devices: dict[str, DeviceRecord] = {}
        self.device_errors: dict[str, Rejection] = {}
        self.pods: dict[str, PodEntry] = {}
        self.podgroups: dict[str, JSON] = {}
        self.reservations: dict[str, Reservation] = {}
        # what the core has assigned per pod key
        self._assigned: dict[str, Assigned] = {}
        self._target: dict[str, str] = {}  # pod key -> the node it holds devices on
        self._by_node: dict[str, set[str]] = defaultdict(set)  # the inverse of _target
        self._tokens = itertools.count(1)
        self.listeners: list[Listener] = []
        # Set by gang scheduling: why a pod must not be bound without a planned reservation.
        self.gang_guard: Callable[[PodRequest], Rejection | None] | None = None

    def _notify(self, kind: str, key: str, obj: JSON | None) -> None:
        for listener in self.listeners:
            listener(kind, key, obj)

    # == Sink (fed by the reflectors) ==============================================================

    def replace(self, kind: Kind, items: list[JSON]) -> None:
        fresh = {self._key_of(kind, obj): obj for obj in items}
        current = self._store(kind)
        for key in [k for k in current if k not in fresh]:
            self._delete(kind, key)
        for obj in fresh.values():
            self._upsert(kind, obj)

    def apply(self, kind: Kind, event_type: str, obj: JSON) -> None:
        if event_type == "DELETED":
            self._delete(kind, self._key_of(kind, obj))
        else:
            self._upsert(kind, obj)

    def _store(self, kind: Kind) -> dict[str, Any]:
        return {"Node": self.nodes, "Pod": self.pods, "Device": self.devices, "PodGroup": self.podgroups}[
            kind.name
        ]

    @staticmethod
    def _key_of(kind: Kind, obj: JSON) -> str:
        meta = _meta(obj)
        if kind.name in (PODS.name, PODGROUPS.name):
            return pod_key(meta.get("namespace") or "default", meta.get("name") or "")
        return meta.get("name") or ""

    def _upsert(self, kind: Kind, obj: JSON) -> None:
        name = kind.name
        if name == NODES.name:
            self._upsert_node(obj)
        elif name == PODS.name:
            self._upsert_pod(obj)
        elif name == DEVICES.name:
            self._upsert_device(obj)
        elif name == PODGROUPS.name:
            key = self._key_of(kind, obj)
            self.podgroups[key] = obj
            self._notify(name, key, obj)

    def _delete(self, kind: Kind, key: str) -> None:
        name = kind.name
        if name == NODES.name:
            if self.nodes.pop(key, None) is not None:
                self.core.remove_node(key)
                # The core forgot the node's pods; they are installed again if the Node returns.
                for pkey in self._by_node.get(key, ()):
                    self._assigned.pop(pkey, None)
                self._notify(name, key, None)
        elif name == PODS.name:
            entry = self.pods.pop(key, None)
            if entry is not None:
                self._drop_reservation(key)
                self._sync_core(key)
                self._notify(name, key, None)
        elif name == DEVICES.name:
            if self.devices.pop(key, None) is not None:
                self.device_errors.pop(key, None)
                self.core.remove_device(key)
                self._notify(name, key, None)
        elif name == PODGROUPS.name and self.podgroups.pop(key, None) is not None:
            self._notify(name, key, None)

    # -- nodes and devices --------------------------------------------------------------------------

    def _upsert_node(self, node: JSON) -> None:
        name = _meta(node).get("name") or ""
        facts = _node_facts(node)
        old = self.nodes.get(name)
        self.nodes[name] = facts
        if old == facts:
            return  # a heartbeat or condition update: nothing the allocator reads
        problem = self.core.set_node(node)
        if problem:
            log.warning("Node %s: %s", name, problem)
        self._notify(NODES.name, name, node)
        if old is None:
            # A Node created again after a delete: its Device CR did not change, so no event
            # will bring the inventory back.
            record = self.devices.get(name)
            if record is not None and not self.core.has_inventory(name):
                self._install_device(name, orjson.loads(zlib.decompress(record.blob)))
            # Pods that arrived before their Node (or outlived its delete) count from now on.
            for key in list(self._by_node.get(name, ())):
                self._sync_core(key)

    def _upsert_device(self, dev: JSON) -> None:
        meta = _meta(dev)
        name = meta.get("name") or ""
        rv = meta.get("resourceVersion") or ""
        old = self.devices.get(name)
        self.devices[name] = DeviceRecord(rv, _compact(dev))
        if rv and old is not None and old.resource_version == rv:
            return  # a relist replaying what we have: no inventory rebuild
        self._install_device(name, dev)
        self._notify(DEVICES.name, name, dev)

    def _install_device(self, name: str, dev: JSON) -> None:
        problem = self.core.set_device(dev)
        if problem is None:
            self.device_errors.pop(name, None)
        else:
            self.device_errors[name] = problem
            log.warning("Device %s: %s", name, problem.message)

    # -- pods -----------------------------------------------------------------------------------------

    def _upsert_pod(self, pod: JSON) -> None:
        meta = _meta(pod)
        key = pod_key(meta.get("namespace") or "default", meta.get("name") or "")
        uid = meta.get("uid") or ""
        old = self.pods.get(key)
        if old is not None and old.uid != uid:
            # Same name, new pod: the old one is gone.
            self.pods.pop(key)
            self._drop_reservation(key)
            self._sync_core(key)
            old = None
        spec = pod.get("spec") or {}
        annotation = (meta.get("annotations") or {}).get(keys.DEVICE_ALLOCATED)
        active = (pod.get("status") or {}).get("phase") not in TERMINAL_POD_PHASES
        node = sys.intern(spec.get("nodeName") or "")  # one string per node, not one per pod
        containers = hashlib.blake2b(orjson.dumps(spec.get("containers")), digest_size=16).digest()
        res = self.reservations.get(key)
        usage: PodUsage | None = None
        if node and active:  # pending and finished pods hold nothing: no need to read them
            if (
                old is not None
                and old.usage is not None
                and old.node == node
                and old.annotation == annotation
                and old.containers == containers
            ):
                usage = old.usage  # a status or label update: nothing the allocator counts changed
            elif res is not None and res.uid == uid and res.node == node and res.annotation == annotation:
                usage = self.core.usage_of(key, node, res.allocations, res.request)  # our own bind
            else:
                usage = self.core.usage(pod)
                if usage.error:
                    log.warning("pod %s: %s (counted without devices)", key, usage.error)
        entry = PodEntry(key, uid, node, active, annotation, usage, containers, None if node else pod)
        self.pods[key] = entry
        if res is not None and (entry.holds or not entry.active or res.uid != uid):
            # Bound (its annotation takes over from the reservation), finished, or another pod.
            if entry.holds and entry.node == res.node and annotation != res.annotation:
                log.warning("%s is bound with an annotation that differs from its reservation", key)
            self._drop_reservation(key)
        self._sync_core(key)
        self._notify(PODS.name, key, pod)

    def _sync_core(self, key: str) -> None:
        """Make the core's assignment of `key` match its reservation, else its pod entry. A pod
        on a node without a Node object (not seen yet, or deleted) is installed once it exists."""
        entry = self.pods.get(key)
        res = self.reservations.get(key)
        want: Assigned | None = None
        if res is not None:
            want = (res.node, res.token, None)
        elif entry is not None and entry.usage is not None:
            want = (entry.node, 0, entry.usage)
        target = self._target.get(key)
        if target is not None and (want is None or want[0] != target):
            self._by_node[target].discard(key)
            del self._target[key]
        if want is not None:
            self._target[key] = want[0]
            self._by_node[want[0]].add(key)
        installable = want if want is not None and want[0] in self.nodes else None
        have = self._assigned.get(key)
        if have == installable:  # PodUsage compares by value
            return
        if have is not None:
            self.core.unassign(key)
            del self._assigned[key]
        if installable is None:
            return
        node = installable[0]
        if res is not None:
            self.core.assign_reservation(key, node, res.allocations, res.request)
        else:
            assert entry is not None and entry.usage is not None
            self.core.assign_usage(key, node, entry.usage)
        self._assigned[key] = installable

    # == the request path ===========================================================================

    def filter(self, req: PodRequest, names: Sequence[str]) -> tuple[list[str], dict[str, Rejection]]:
        """Names that can host the pod's devices, in the order given, and a reason for each other.
        A node whose Device CR does not decode says so rather than "no free GPU"."""
        passed, failed = self.core.filter(req, names)
        for name, problem in self.device_errors.items():
            if name in failed:
                failed[name] = problem
        return passed, failed

    def filter_verdicts(self, req: PodRequest, names: Sequence[str]) -> FilterVerdicts:
        """`filter` as the extender replies it (passed, failed and unresolvable messages, counts
        per reason code), without a per-node Python loop."""
        verdicts = self.core.filter_verdicts(req, names)
        errors = self.device_errors
        if errors and any(n in verdicts.failed or n in verdicts.unresolvable for n in errors):
            # Rare (a Device CR that does not decode): the per-node path, which keeps the order.
            return FilterVerdicts.from_rejections(*self.filter(req, names))
        return verdicts

    def score(self, req: PodRequest, names: Sequence[str]) -> dict[str, int]:
        """The core's 0..10 for the names (0 for nodes the cache does not know)."""
        return self.core.score(req, names)

    def score_column(self, req: PodRequest, names: Sequence[str]) -> np.ndarray:
        """`score` as an int64 array aligned with `names`."""
        return self.core.score_column(req, names)

    def reserve(self, pod: JSON, req: PodRequest, node: str) -> Reservation | Rejection:
        """Choose devices for `pod` on `node` and hold them (kube-scheduler's "assume").

        Synchronous from choice to hold: no other bind can run in between."""
        meta = _meta(pod)
        key = pod_key(meta.get("namespace") or "default", meta.get("name") or "")
        held = self.reservations.get(key)
        if held is not None and held.gang and not held.binding:
            refusal = self.gang_refusal(req, node)
            if refusal is not None:
                return refusal
            held.binding = True
            return held
        if held is not None:
            return Rejection("topoalloc: bind in progress", "another bind of this pod is in progress")
        if node not in self.nodes:
            return NOT_IN_CACHE
        entry = self.pods.get(key)
        if entry is not None and entry.holds:
            return Rejection("topoalloc: already bound", f"pod is already bound to {entry.node}", True)
        refusal = self.gang_refusal(req, node)
        if refusal is not None:
            return refusal
        chosen = self.core.allocate(req, node)
        if isinstance(chosen, Rejection):
            return chosen
        res = Reservation(
            token=next(self._tokens),
            key=key,
            uid=meta.get("uid") or "",
            node=node,
            allocations=chosen,
            annotation=chosen.to_json(),
            request=req,
            expires=self.clock() + self.reservation_ttl,
        )
        self.reservations[key] = res
        self._sync_core(key)
        self._gauge()
        return res

    def release(self, res: Reservation) -> bool:
        """Roll back `res` if it is still the pod's current reservation. A planned one stays held
        (the gang's plan stands; bind may be tried again): only its bind is over."""
        current = self.reservations.get(res.key)
        if current is None or current.token != res.token:
            return False
        if current.gang:
            current.binding = False
            return True
        self._drop_reservation(res.key)
        self._sync_core(res.key)
        return True

    # -- gang plans ----------------------------------------------------------------------------------

    def gang_refusal(self, req: PodRequest, node: str) -> Rejection | None:
        """Why the pod may not be bound to `node`: a plan holds it elsewhere (or for an older pod of
        its name), or it is a gang member without a plan. None: go ahead."""
        res = self.reservations.get(req.key)
        if res is not None and res.gang:
            if req.uid and res.uid != req.uid:
                return Rejection(GANG_PLAN, f"gang {res.gang} planned an earlier pod of this name")
            if res.node != node:
                return Rejection(GANG_PLAN, f"gang {res.gang} planned this pod for node {res.node}")
            return None
        return self.gang_guard(req) if self.gang_guard is not None else None

    def reserve_planned(
        self, key: str, uid: str, node: str, allocations: DeviceAllocations, req: PodRequest, gang: str
    ) -> Reservation | Rejection:
        """Hold a gang member's planned devices on its planned node until it is bound there or
        `release_planned`. Refused while the pod is bound or another reservation holds it."""
        entry = self.pods.get(key)
        if entry is None or entry.uid != uid or entry.node or not entry.active:
            return Rejection(GANG_PLAN, "the pod is gone, bound or finished")
        if key in self.reservations or node not in self.nodes:
            return Rejection(GANG_PLAN, "the pod or its node is busy")
        res = Reservation(
            token=next(self._tokens),
            key=key,
            uid=uid,
            node=node,
            allocations=allocations,
            annotation=allocations.to_json(),
            request=req,
            expires=math.inf,  # the gang controller releases it, not the TTL
            gang=gang,
        )
        self.reservations[key] = res
        self._sync_core(key)
        self._gauge()
        return res

    def release_planned(self, key: str, *, force: bool = False) -> bool:
        """Drop a planned reservation unless its bind is under way (that bind ends in a binding or
        in a rollback that leaves the hold to us again); `force` drops it anyway (leadership lost,
        or a bind that never finished)."""
        res = self.reservations.get(key)
        if res is None or not res.gang or (res.binding and not force):
            return False
        self._drop_reservation(key)
        self._sync_core(key)
        return True

    def expire_reservations(self) -> int:
        now = self.clock()
        expired = [r for r in self.reservations.values() if r.expires <= now]
        for res in expired:
            log.warning("reservation of %s on %s expired: the pod never showed up bound", res.key, res.node)
            self.release(res)
        if expired and self.metrics:
            self.metrics.reservations_expired.inc(len(expired))
        return len(expired)

    def _drop_reservation(self, key: str) -> None:
        if self.reservations.pop(key, None) is not None:
            self._gauge()

    def _gauge(self) -> None:
        if self.metrics:
            self.metrics.reservations.set(len(self.reservations))

    # == views ========================================================================================

    def pod(self, namespace: str, name: str) -> PodEntry | None:
        return self.pods.get(pod_key(namespace, name))

    def holdings(self) -> dict[str, tuple[str, str]]:
        """pod key -> (node, device-allocated JSON) for everything that holds devices now."""
        out: dict[str, tuple[str, str]] = {}
        for key, entry in self.pods.items():
            if entry.holds and key not in self.reservations and entry.allocations:
                out[key] = (entry.node, entry.allocations.to_json())
        for key, res in self.reservations.items():
            out[key] = (res.node, res.annotation)
        return out

    def allocated_devices(self) -> Iterable[tuple[str, str, int]]:
        """(node, device type, devices with something allocated) for the metrics scrape."""
        taken: dict[tuple[str, str], set[int]] = defaultdict(set)
        for key, (node, _token, _usage) in self._assigned.items():
            res = self.reservations.get(key)
            allocs = res.allocations if res is not None else self.pods[key].allocations
            for dtype, entries in (allocs.by_type if allocs else {}).items():
                taken[(node, dtype)].update(a.minor for a in entries)
        return [(node, dtype, len(minors)) for (node, dtype), minors in sorted(taken.items())]


NodeFacts = tuple[Any, Any, Any]


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    resource_version: str
    blob: bytes  # the Device CR as zlib-compressed JSON, without managedFields


def _compact(dev: JSON) -> bytes:
    meta = _meta(dev)
    if "managedFields" in meta:
        dev = {**dev, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return zlib.compress(orjson.dumps(dev), 1)


def _node_facts(node: JSON) -> NodeFacts:
    """What the allocator reads of a Node (labels, allocatable, spec): an update that leaves them
    alone (heartbeats, conditions, images) changes nothing."""
    return (
        _meta(node).get("labels") or {},
        (node.get("status") or {}).get("allocatable") or {},
        node.get("spec") or {},
    )
