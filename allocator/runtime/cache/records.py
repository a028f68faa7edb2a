"""What the watch cache keeps per object: a pod's entry, a reservation, the facts of a Node."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from allocator.runtime.coreadapter import PodRequest, PodUsage
from apis import keys
from apis.annotations import DeviceAllocations

JSON = dict[str, Any]
# What the core counts for a pod: (node, reservation token or 0, the pod's usage or None)
Assigned = tuple[str, int, "PodUsage | None"]
# (kind name, object key, the object, or None once deleted)
Listener = Callable[[str, str, "JSON | None"], None]


def pod_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def meta_of(obj: JSON) -> JSON:
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
    containers: bytes  # a digest of spec.containers (`containers_digest`), to notice a resize
    # The whole object only while the pod waits for a node (bind reads it); a cluster's bound
    # pods would otherwise keep hundreds of megabytes of managedFields and status alive.
    raw: JSON | None
    # For preemption, which reads bound pods long after `raw` is gone.
    priority: int = 0  # spec.priority
    gang: str = ""  # "NS/NAME" of the gang it names ("" for none)
    deleting: bool = False  # a deletionTimestamp: already on its way out
    labels: Mapping[str, str] = field(default_factory=dict)  # PodDisruptionBudgets select by them
    # For defragmentation, which weighs bound pods: its controller ("Kind/name", "" for a bare
    # pod), status.startTime as written (parsed only by the planner), its Ready condition, and,
    # where the cache keeps outlines, the pod as its replacement would ask (`outline`).
    owner: str = ""
    started: str = ""
    ready: bool = False
    outline: bytes | None = None

    @property
    def holds(self) -> bool:
        return bool(self.node) and self.active

    @property
    def allocations(self) -> DeviceAllocations | None:
        return self.usage.allocations if self.usage is not None else None


@dataclass
class Hold:
    token: int
    key: str
    uid: str
    node: str
    allocations: DeviceAllocations
    annotation: str  # allocations as the device-allocated JSON that bind writes
    request: PodRequest
    expires: float
    # Who holds this beyond a bind (a gang's plan, allocator/gang/holds.py; a Reservation's room,
    # allocator/reservations): such a hold has no TTL and ends when the pod is bound or its holder
    # drops it.
    holder: str = ""
    binding: bool = False  # a bind of a held pod is under way
    # A bind that takes from a Reservation's room: its name, and the annotations the binding
    # writes beside device-allocated (reservation-allocated).
    room: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)
    # A hold ahead (placed at admission): `requests_digest` of the pod it was made for, so the pod
    # that shows up asking the same keeps `request` instead of being parsed again.
    shape: bytes = b""


class NodeFacts(NamedTuple):
    """What the allocator reads of a Node: an update that leaves these alone (heartbeats,
    conditions, images) changes nothing."""

    labels: Mapping[str, str]
    allocatable: Mapping[str, Any]
    spec: JSON  # taints, unschedulable


def node_facts(node: JSON) -> NodeFacts:
    return NodeFacts(
        meta_of(node).get("labels") or {},
        (node.get("status") or {}).get("allocatable") or {},
        node.get("spec") or {},
    )


# What an outline keeps of a container: what the pod's request is computed from.
_CONTAINER_FIELDS = ("name", "resources", "restartPolicy")
_LEFT_OUT = ("kubectl.kubernetes.io/last-applied-configuration", keys.DEVICE_ALLOCATED)


def pod_outline(pod: JSON) -> bytes:
    """The pod as its replacement would ask (orjson): metadata without managedFields, the
    last-applied copy and the device allocation (the entry keeps that already), the
    spec without volumes and with each container cut to its name, resources and restart policy;
    no status. A request parsed from it is the one parsed from the pod (every field the parser
    reads is kept), and a Reservation's template is built from it."""
    meta = meta_of(pod)
    notes = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _LEFT_OUT}
    keep_meta = {k: v for k, v in meta.items() if k not in ("managedFields", "annotations")}
    keep_meta["annotations"] = notes
    spec = dict(pod.get("spec") or {})
    spec.pop("volumes", None)
    for field_ in ("containers", "initContainers"):
        if isinstance(spec.get(field_), list):
            spec[field_] = [
                {k: c[k] for k in _CONTAINER_FIELDS if k in c} if isinstance(c, dict) else c
                for c in spec[field_]
            ]
    return orjson.dumps({"metadata": keep_meta, "spec": spec})


def outline_pod(entry: PodEntry) -> JSON | None:
    """The pod an entry's outline describes, its device allocation put back; None without one."""
    if entry.outline is None:
        return None
    pod: JSON = orjson.loads(entry.outline)
    if entry.annotation is not None:
        pod["metadata"]["annotations"][keys.DEVICE_ALLOCATED] = entry.annotation
    return pod


def controller_ref(meta: JSON) -> str:
    """ "Kind/name" of the object's controller, "" for none."""
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return f"{ref.get('kind', '')}/{ref.get('name', '')}"
    return ""


def is_ready(pod: JSON) -> bool:
    """The pod's Ready condition is True."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def requests_digest(spec: JSON) -> bytes:
    """16 bytes that change when what the pod's cpu, memory and device counts are read from does
    (its containers, init containers, overhead and pod-level resources)."""
    parts = [spec.get(k) for k in ("containers", "initContainers", "overhead", "resources")]
    return hashlib.blake2b(orjson.dumps(parts), digest_size=16).digest()


def containers_digest(spec: JSON) -> bytes:
    """16 bytes that change when spec.containers does: a bound pod's containers (env, mounts,
    probes...) would otherwise stay in memory just to be compared on its next update."""
    return hashlib.blake2b(orjson.dumps(spec.get("containers")), digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """What the cache keeps of a Device CR once the core has read it: its resourceVersion (a
    relist that replays it rebuilds nothing) and the object as zlib-compressed JSON without
    managedFields, read again only when its Node is deleted and registered again."""

    resource_version: str
    blob: bytes
    updated: str = ""  # status.updateTime as written: the agent's last refresh (fleet metrics)

    @classmethod
    def of(cls, dev: JSON) -> DeviceRecord:
        meta = meta_of(dev)
        if "managedFields" in meta:
            dev = {**dev, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        status = dev.get("status")
        updated = str(status.get("updateTime") or "") if isinstance(status, dict) else ""
        return cls(str(meta.get("resourceVersion") or ""), zlib.compress(orjson.dumps(dev), 1), updated)

    def device(self) -> JSON:
        return orjson.loads(zlib.decompress(self.blob))  # type: ignore[no-any-return]
