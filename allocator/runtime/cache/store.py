"""The watch cache: raw Nodes, Pods, Devices, the objects that define gangs (scheduler-plugins
PodGroups; Kubernetes' own PodGroups and Workloads where the server serves them), Reservations and
the DRA kinds (allocator/runtime/cache/dra.py), fed incrementally into the allocator core's cluster
state, with the hold ledger (allocator/runtime/ledger.py) beside the pods, and the
PodDisruptionBudgets preemption weighs (`budgets`, budgets.py).

Who holds devices:
  * a pod with `spec.nodeName` that has not terminated holds what its `device-allocated`
    annotation says (this is how a restart rebuilds every allocation: the first LIST replays
    every bound pod);
  * an entry of the ledger (`ledger`: a bind reservation, a gang's hold) holds what it says,
    and takes precedence over the pod's own entry until the pod shows up bound;
  * a Reservation's room (a ledger entry of its own, kept by allocator/reservations) holds what
    its owners have not taken yet;
  * what placement chose at admission for a pod not created yet is held ahead (a ledger entry
    under a key of its own) until the pod shows up carrying it: then that hold becomes the pod's;
  * an allocated ResourceClaim holds its devices under `claim:<namespace>/<name>` (a claim hold
    of the ledger while topoalloc writes the allocation).
A pod that carries the annotation but is not bound holds nothing: the annotation was written by a
bind that did not finish, and kube-scheduler will call bind again.

`listeners` hear of every change the cache takes in, so the gang controller wakes up instead of
polling. All methods are synchronous and the process runs one event loop (see the ledger on why
that makes choose-and-reserve a critical section without a lock).
"""

from __future__ import annotations

import logging
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from allocator.runtime.cache.budgets import DisruptionBudgets
from allocator.runtime.cache.dra import DraStore
from allocator.runtime.cache.records import (
    JSON,
    Assigned,
    DeviceRecord,
    Listener,
    NodeFacts,
    PodEntry,
    containers_digest,
    controller_ref,
    is_ready,
    meta_of,
    node_facts,
    pod_key,
    pod_outline,
    requests_digest,
)
from allocator.runtime.coreadapter import CoreAdapter, PodUsage
from allocator.runtime.kube import (
    DEVICES,
    DRA_KINDS,
    NATIVE_PODGROUPS,
    NODES,
    PDBS,
    PODGROUPS,
    PODS,
    RESERVATIONS,
    RESOURCECLAIMS,
    WORKLOADS,
    Kind,
)
from allocator.runtime.ledger import ROOM_HOLDER, HoldLedger
from allocator.runtime.metrics import Metrics
from apis import keys
from apis.annotations import allocated_elsewhere
from apis.errors import CodecError
from apis.podgroup import gang_of, spec_priority
from apis.resources import TERMINAL_POD_PHASES

log = logging.getLogger(__name__)


class ClusterCache:
    def __init__(
        self,
        core: CoreAdapter,
        *,
        reservation_ttl: float = 120.0,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        outlines: bool = False,
    ) -> None:
        self.core = core
        # Keep each bound pod's outline while it holds devices (records.pod_outline): what
        # defragmentation needs to weigh and move it, read from here instead of a LIST per pass.
        self.outlines = outlines
        # Of a Node only what the allocator reads: a real Node is mostly status that changes often.
        self.nodes: dict[str, NodeFacts] = {}
        # Of a Device its resourceVersion and itself as compressed JSON (2-3 KB instead of a
        # 25-80 KB dict), decoded again only for a Node that is deleted and created again.
        self.devices: dict[str, DeviceRecord] = {}
        self.pods: dict[str, PodEntry] = {}
        # Objects that define gangs, raw and keyed NS/NAME: read only by gang scheduling, per pass.
        self.podgroups: dict[str, JSON] = {}
        self.native_podgroups: dict[str, JSON] = {}
        self.workloads: dict[str, JSON] = {}
        self._objects = {
            PODGROUPS.name: self.podgroups,
            NATIVE_PODGROUPS.name: self.native_podgroups,
            WORKLOADS.name: self.workloads,
        }
        self.reservations: dict[str, JSON] = {}  # by name (cluster-scoped), as read
        self.budgets = DisruptionBudgets()
        # what the core has assigned per pod key
        self._assigned: dict[str, Assigned] = {}
        self._target: dict[str, str] = {}  # pod key -> the node it holds devices on
        self._by_node: dict[str, set[str]] = defaultdict(set)  # the inverse of _target
        self.listeners: list[Listener] = []
        self.ledger = HoldLedger(
            core.allocate,
            pods=self.pods,
            nodes=self.nodes,
            settle=self._sync_core,
            move=self._move_core,
            ttl=reservation_ttl,
            metrics=metrics,
            clock=clock,
        )
        # ResourceClaims (their devices count like a bound pod's), templates, classes, slices.
        self.dra = DraStore(core, self.ledger, settle=self._sync_core, notify=self._notify)

    def _notify(self, kind: str, key: str, obj: JSON | None) -> None:
        for listener in self.listeners:
            listener(kind, key, obj)

    # == Sink (fed by the reflectors) ==============================================================

    def replace(self, kind: Kind, items: Iterable[JSON]) -> None:
        """Iterates `items` twice (keys first, for the deletions), so a LIST kept as page text
        (kube.ListPages) is decoded a page at a time instead of held as dicts all at once."""
        fresh = {self._key_of(kind, obj) for obj in items}
        current = self._store(kind)
        for key in [k for k in current if k not in fresh]:
            self._delete(kind, key)
        for obj in items:
            self._upsert(kind, obj)

    def apply(self, kind: Kind, event_type: str, obj: JSON) -> None:
        if event_type == "DELETED":
            self._delete(kind, self._key_of(kind, obj))
        else:
            self._upsert(kind, obj)

    def _store(self, kind: Kind) -> Any:
        if kind in DRA_KINDS:
            return self.dra.store(kind.name)
        if kind.name in self._objects:
            return self._objects[kind.name]
        stores: dict[str, Any] = {
            NODES.name: self.nodes,
            PODS.name: self.pods,
            DEVICES.name: self.devices,
            RESERVATIONS.name: self.reservations,
            PDBS.name: self.budgets,
        }
        return stores[kind.name]

    def _raw(self, name: str) -> bool:
        """A kind kept as read (gangs' objects, Reservations), for its readers to decode."""
        return name in self._objects or name == RESERVATIONS.name

    def _key_of(self, kind: Kind, obj: JSON) -> str:
        meta = meta_of(obj)
        namespaced = (PODS.name, RESOURCECLAIMS.name, "ResourceClaimTemplate", PDBS.name)
        if kind.name in namespaced or kind.name in self._objects:
            return pod_key(meta.get("namespace") or "default", meta.get("name") or "")
        return meta.get("name") or ""

    def _upsert(self, kind: Kind, obj: JSON) -> None:
        name = kind.name
        if kind in DRA_KINDS:
            self.dra.upsert(name, self._key_of(kind, obj), obj)
        elif name == NODES.name:
            self._upsert_node(obj)
        elif name == PODS.name:
            self._upsert_pod(obj)
        elif name == DEVICES.name:
            self._upsert_device(obj)
        elif self._raw(name):
            key = self._key_of(kind, obj)
            self._store(kind)[key] = obj
            self._notify(name, key, obj)
        elif name == PDBS.name:
            self.budgets.upsert(obj)
            self._notify(name, self._key_of(kind, obj), obj)

    def _delete(self, kind: Kind, key: str) -> None:
        name = kind.name
        if kind in DRA_KINDS:
            self.dra.delete(name, key)
        elif name == NODES.name:
            if self.nodes.pop(key, None) is not None:
                self.core.remove_node(key)
                # The core forgot the node's pods; they are installed again if the Node returns.
                for pkey in self._by_node.get(key, ()):
                    self._assigned.pop(pkey, None)
                self._notify(name, key, None)
        elif name == PODS.name:
            entry = self.pods.pop(key, None)
            if entry is not None:
                self.ledger.drop(key)
                self._sync_core(key)
                self._notify(name, key, None)
        elif name == DEVICES.name:
            if self.devices.pop(key, None) is not None:
                self.core.remove_device(key)
                self._notify(name, key, None)
        elif self._raw(name) and self._store(kind).pop(key, None) is not None:
            self._notify(name, key, None)
        elif name == PDBS.name and key in self.budgets:
            self.budgets.delete(key)
            self._notify(name, key, None)

    # -- nodes and devices --------------------------------------------------------------------------

    def _upsert_node(self, node: JSON) -> None:
        name = meta_of(node).get("name") or ""
        facts = node_facts(node)
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
                self._install_device(name, record.device())
            # Pods that arrived before their Node (or outlived its delete) count from now on.
            for key in list(self._by_node.get(name, ())):
                self._sync_core(key)

    def _upsert_device(self, dev: JSON) -> None:
        meta = meta_of(dev)
        name = meta.get("name") or ""
        rv = meta.get("resourceVersion") or ""
        old = self.devices.get(name)
        if rv and old is not None and old.resource_version == rv:
            return  # a relist replaying what we have: no inventory rebuild, no new record
        self.devices[name] = DeviceRecord.of(dev)
        self._install_device(name, dev)
        self._notify(DEVICES.name, name, dev)

    def _install_device(self, name: str, dev: JSON) -> None:
        problem = self.core.set_device(dev)
        if problem is not None:
            log.warning("Device %s: %s", name, problem.message)
        self.dra.node_changed(name)

    # -- pods -----------------------------------------------------------------------------------------

    def _upsert_pod(self, pod: JSON) -> None:
        meta = meta_of(pod)
        key = pod_key(meta.get("namespace") or "default", meta.get("name") or "")
        uid = meta.get("uid") or ""
        old = self.pods.get(key)
        if old is not None and old.uid != uid:
            # Same name, new pod: the old one is gone.
            self.pods.pop(key)
            self.ledger.drop(key)
            self._sync_core(key)
            old = None
        spec = pod.get("spec") or {}
        annotations = meta.get("annotations") or {}
        annotation = annotations.get(keys.DEVICE_ALLOCATED)
        active = (pod.get("status") or {}).get("phase") not in TERMINAL_POD_PHASES
        node = sys.intern(spec.get("nodeName") or "")  # one string per node, not one per pod
        if node and allocated_elsewhere(annotations, node):
            annotation = None  # made for another node: counts nothing here (core/request/usage.py)
        containers = containers_digest(spec)
        recorded = annotations.get(keys.ALLOCATED_NODE)
        if (
            old is None
            and self.ledger.ahead
            and recorded
            and isinstance(annotations.get(keys.DEVICE_ALLOCATED), str)
        ):
            # Placed at admission, seen for the first time: the hold made ahead for it becomes its
            # own (a pod seen before never takes one: a share of a GPU equal to its own may be
            # held ahead for another pod).
            self.ledger.adopt(
                key,
                uid,
                recorded,
                annotations[keys.DEVICE_ALLOCATED],
                requests_digest(spec),
                lambda: self.core.request(pod),
            )
        res = self.ledger.holds.get(key)
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
        status = pod.get("status") or {}
        outline = None
        if self.outlines and usage is not None and usage.allocations is not None:
            outline = pod_outline(pod)
        entry = PodEntry(
            key,
            uid,
            node,
            active,
            annotation,
            usage,
            containers,
            None if node else pod,
            priority=spec_priority(spec),
            gang=_gang_key(pod),
            deleting=bool(meta.get("deletionTimestamp")),
            labels=_labels(meta, old),
            owner=sys.intern(controller_ref(meta)),
            started=status.get("startTime") or "",
            ready=is_ready(pod),
            outline=outline,
        )
        self.pods[key] = entry
        if res is not None and (entry.holds or not entry.active or res.uid != uid):
            # Bound (its annotation takes over from the reservation), finished, or another pod.
            if entry.holds and entry.node == res.node and annotation != res.annotation:
                log.warning("%s is bound with an annotation that differs from its reservation", key)
            self.ledger.drop(key)
        self._sync_core(key)
        self._notify(PODS.name, key, pod)

    def _move_core(self, old: str, new: str) -> None:
        """What the core counts for `old` is now `new`'s (a hold made at admission that its pod
        adopted): re-keyed in place, so its node's cached verdicts and scores stay valid, where
        `_sync_core` would take the pod off its node and put it back."""
        have = self._assigned.get(old)
        if have is None or new in self._assigned or not self.core.rekey(old, new):
            return
        self._assigned[new] = self._assigned.pop(old)
        target = self._target.pop(old, None)
        if target is not None:
            self._by_node[target].discard(old)
            self._by_node[target].add(new)
            self._target[new] = target

    def _sync_core(self, key: str) -> None:
        """Make the core's assignment of `key` match its reservation, else its pod entry. A pod
        on a node without a Node object (not seen yet, or deleted) is installed once it exists."""
        entry = self.pods.get(key)
        res = self.ledger.holds.get(key)
        want: Assigned | None = None
        if res is not None:
            want = (res.node, res.token, None)
        elif entry is not None and entry.usage is not None:
            want = (entry.node, 0, entry.usage)
        elif (claimed := self.dra.usage(key)) is not None:
            want = (claimed.node, 0, claimed)  # a ResourceClaim's devices
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
        if (
            have is not None
            and installable is not None
            and installable[2] is not None
            and have[0] == installable[0]
            and self.core.counted_as(key, installable[0], installable[2])
        ):
            # Bound as it was held: counted already, and its node's cached columns stay valid.
            self._assigned[key] = installable
            return
        if have is not None:
            self.core.unassign(key)
            del self._assigned[key]
        if installable is None:
            return
        node = installable[0]
        if res is not None and res.holder == ROOM_HOLDER:
            # A room is no placement of the scorer's to learn from: counted as a bound pod is.
            self.core.assign_usage(key, node, self.core.usage_of(key, node, res.allocations, res.request))
        elif res is not None:
            self.core.assign_reservation(key, node, res.allocations, res.request)
        else:
            assert installable[2] is not None
            self.core.assign_usage(key, node, installable[2])
        self._assigned[key] = installable

    # == views ========================================================================================

    def pod(self, namespace: str, name: str) -> PodEntry | None:
        return self.pods.get(pod_key(namespace, name))

    def holdings(self) -> dict[str, tuple[str, str]]:
        """pod key -> (node, device-allocated JSON) for everything that holds devices now."""
        out: dict[str, tuple[str, str]] = {}
        for key, entry in self.pods.items():
            if entry.holds and key not in self.ledger.holds and entry.allocations:
                out[key] = (entry.node, entry.allocations.to_json())
        for key, res in self.ledger.holds.items():
            out[key] = (res.node, res.annotation)
        return out

    def allocated_devices(self) -> Iterable[tuple[str, str, int]]:
        """(node, device type, devices with something allocated) for the metrics scrape."""
        taken: dict[tuple[str, str], set[int]] = defaultdict(set)
        for key, (node, _token, usage) in self._assigned.items():
            res = self.ledger.holds.get(key)
            allocs = res.allocations if res is not None else usage.allocations if usage else None
            for dtype, entries in (allocs.by_type if allocs else {}).items():
                taken[(node, dtype)].update(a.minor for a in entries)
        return [(node, dtype, len(minors)) for (node, dtype), minors in sorted(taken.items())]


def _labels(meta: JSON, old: PodEntry | None) -> Mapping[str, str]:
    """The pod's labels (PodDisruptionBudgets select by them), the old entry's when unchanged."""
    labels = meta.get("labels") or {}
    if old is not None and old.labels == labels:
        return old.labels
    return MappingProxyType(dict(labels))


def _gang_key(pod: JSON) -> str:
    try:
        gang = gang_of(pod)
    except (CodecError, AttributeError, TypeError):
        return ""
    return gang.key if gang is not None else ""
