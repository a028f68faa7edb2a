"""What the watch cache keeps per object: a pod's entry, a reservation, the facts of a Node."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from allocator.runtime.coreadapter import PodRequest, PodUsage
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

    @classmethod
    def of(cls, dev: JSON) -> DeviceRecord:
        meta = meta_of(dev)
        if "managedFields" in meta:
            dev = {**dev, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        return cls(str(meta.get("resourceVersion") or ""), zlib.compress(orjson.dumps(dev), 1))

    def device(self) -> JSON:
        return orjson.loads(zlib.decompress(self.blob))  # type: ignore[no-any-return]
