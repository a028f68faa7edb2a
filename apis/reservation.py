"""The Reservation CR (scheduling.koordinator.sh/v1alpha1, cluster-scoped): room on a node held for
pods that do not exist yet, and who may use it (Koordinator's `reservation_types.go`).

`Reservation.from_dict` reads the fields topoalloc serves and raises CodecError naming the field
for anything malformed; the allocator turns that into a status condition, never a crash. The pod
side of the protocol (which reservation a pod used, which it wants) is `apis.reservation_pod`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apis import decode as d
from apis import keys
from apis.annotations import DeviceAllocations, parse_device_allocated
from apis.errors import CodecError
from apis.quantity import Quantity
from apis.selector import LabelSelector
from apis.timestamps import parse_duration, parse_time

GROUP = "scheduling.koordinator.sh"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Reservation"
PLURAL = "reservations"

PENDING, AVAILABLE, SUCCEEDED, WAITING, FAILED = "Pending", "Available", "Succeeded", "Waiting", "Failed"
PHASES = (PENDING, AVAILABLE, SUCCEEDED, WAITING, FAILED)
ALIGNED, RESTRICTED = "Aligned", "Restricted"
POLICIES = ("", ALIGNED, RESTRICTED)  # "" (Default) is served as Aligned, as Koordinator does
SCHEDULED, READY = "Scheduled", "Ready"  # condition types
DEFAULT_TTL = 24 * 3600.0  # the CRD's default `ttl: 24h`
POD_COUNT = "pods"  # a template request of `pods: N` limits the reservation to N owners

# A reservation that is one member of a gang reserved as a whole (topoalloc's own keys): the gang's
# name (label) and how many Reservations it has (annotation); they are placed all at once or not.
GANG = keys.TOPOALLOC + "reservation-gang"
GANG_SIZE = keys.TOPOALLOC + "reservation-gang-size"


_SPEC_FIELDS = (
    "template", "owners", "ttl", "expires", "allocateOnce", "allocatePolicy", "unschedulable", "taints",
    "preAllocation",
)  # fmt: skip


@dataclass(frozen=True)
class ObjectOwner:
    """`owners[].object`: the pod itself (empty fields match anything)."""

    namespace: str = ""
    name: str = ""
    uid: str = ""

    def matches(self, meta: Mapping[str, Any]) -> bool:
        return (
            (not self.uid or meta.get("uid") == self.uid)
            and (not self.name or meta.get("name") == self.name)
            and (not self.namespace or (meta.get("namespace") or "default") == self.namespace)
        )


@dataclass(frozen=True)
class ControllerOwner:
    """`owners[].controller`: one of the pod's ownerReferences (plus an optional namespace)."""

    namespace: str = ""
    name: str = ""
    uid: str = ""
    kind: str = ""
    api_version: str = ""
    controller: bool | None = None

    def matches(self, meta: Mapping[str, Any]) -> bool:
        if self.namespace and (meta.get("namespace") or "default") != self.namespace:
            return False
        for ref in meta.get("ownerReferences") or []:
            if not isinstance(ref, dict):
                continue
            if (
                (self.controller is None or bool(ref.get("controller")) == self.controller)
                and (not self.uid or ref.get("uid") == self.uid)
                and (not self.name or ref.get("name") == self.name)
                and (not self.kind or ref.get("kind") == self.kind)
                and (not self.api_version or ref.get("apiVersion") == self.api_version)
            ):
                return True
        return False


@dataclass(frozen=True)
class Owner:
    """One entry of `spec.owners`: its parts are ANDed, the entries ORed; `{}` matches every pod."""

    obj: ObjectOwner | None = None
    controller: ControllerOwner | None = None
    selector: LabelSelector | None = None

    def matches(self, meta: Mapping[str, Any]) -> bool:
        return (
            (self.obj is None or self.obj.matches(meta))
            and (self.controller is None or self.controller.matches(meta))
            and (self.selector is None or self.selector.matches(meta.get("labels") or {}))
        )

    @classmethod
    def from_dict(cls, value: Any, path: str) -> Owner:
        data = d.struct(value, path, ("object", "controller", "labelSelector"))
        obj = controller = selector = None
        if data.get("object") is not None:
            opath = d.join(path, "object")
            o = d.struct(data["object"], opath, ("namespace", "name", "uid", "kind", "apiVersion"))
            obj = ObjectOwner(
                d.string(o, "namespace", opath), d.string(o, "name", opath), d.string(o, "uid", opath)
            )
        if data.get("controller") is not None:
            cpath = d.join(path, "controller")
            fields = ("namespace", "name", "uid", "kind", "apiVersion", "controller")
            c = d.struct(data["controller"], cpath, fields)
            flag = c.get("controller")
            controller = ControllerOwner(
                d.string(c, "namespace", cpath),
                d.string(c, "name", cpath),
                d.string(c, "uid", cpath),
                d.string(c, "kind", cpath),
                d.string(c, "apiVersion", cpath),
                None if flag is None else d.boolean(c, "controller", cpath),
            )
        if data.get("labelSelector") is not None:
            selector = LabelSelector.from_dict(data["labelSelector"], d.join(path, "labelSelector"))
        return cls(obj, controller, selector)


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class Reservation:
    """A Reservation as read from the API (or a file). `template` is the pod template verbatim."""

    name: str
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    created: float | None = None  # creationTimestamp, seconds since the epoch
    deleting: bool = False
    template: Mapping[str, Any] = field(default_factory=dict)
    owners: tuple[Owner, ...] = ()
    ttl: float | None = DEFAULT_TTL  # None: never expires by age
    expires: float | None = None  # an absolute expiry, checked before `ttl`
    allocate_once: bool = True
    policy: str = ""
    unschedulable: bool = False
    taints: tuple[Mapping[str, Any], ...] = ()
    pre_allocation: bool = False
    phase: str = ""
    node: str = ""
    conditions: tuple[Condition, ...] = ()
    allocatable: Mapping[str, Quantity] = field(default_factory=dict)
    current_owners: tuple[Mapping[str, str], ...] = ()
    reserved: DeviceAllocations | None = None  # the `device-allocated` annotation

    # -- reading -----------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, value: Any) -> Reservation:
        data = d.struct(value, "", ("apiVersion", "kind", "metadata", "spec", "status"))
        api = d.string(data, "apiVersion", "")
        if api and api != API_VERSION:
            raise CodecError("apiVersion", f"expected {API_VERSION}", api)
        meta = d.obj(data.get("metadata") or {}, "metadata")
        name = d.string(meta, "name", "metadata")
        annotations = d.str_map(meta, "annotations", "metadata")
        spec = d.struct(
            data.get("spec") or {},
            "spec",
            _SPEC_FIELDS,
        )
        template = spec.get("template")
        if template is None:
            raise CodecError("spec.template", "is required", None, show_value=False)
        template = d.struct(template, "spec.template", ("metadata", "spec"))
        d.obj(template.get("spec") or {}, "spec.template.spec")
        owners = d.array(spec, "owners", "spec")
        if not owners:
            raise CodecError("spec.owners", "needs at least one owner (who may use the room)", owners)
        ttl: float | None = DEFAULT_TTL
        if spec.get("ttl") is not None:
            raw = d.string(spec, "ttl", "spec")
            ttl = parse_duration(raw)
            if ttl is None:
                raise CodecError("spec.ttl", "is not a duration such as '1h30m'", raw)
            ttl = ttl or None  # 0 turns expiry by age off
        expires = None
        if spec.get("expires") is not None:
            expires = parse_time(spec.get("expires"))
            if expires is None:
                raise CodecError(
                    "spec.expires", "is not a timestamp such as 2030-01-02T09:00:00Z", spec["expires"]
                )
        policy = d.one_of(d.string(spec, "allocatePolicy", "spec"), POLICIES, "spec.allocatePolicy")
        taints = tuple(
            _taint(t, d.join("spec.taints", i)) for i, t in enumerate(d.array(spec, "taints", "spec"))
        )
        status = d.struct(
            data.get("status") or {},
            "status",
            ("phase", "nodeName", "conditions", "allocatable", "currentOwners"),
        )
        phase = d.string(status, "phase", "status")
        if phase:
            d.one_of(phase, PHASES, "status.phase")
        reserved = None
        raw_reserved = annotations.get(keys.DEVICE_ALLOCATED)
        if raw_reserved:
            reserved = parse_device_allocated(raw_reserved)
        return cls(
            name=name,
            uid=d.string(meta, "uid", "metadata"),
            labels=d.str_map(meta, "labels", "metadata"),
            annotations=annotations,
            created=parse_time(meta.get("creationTimestamp")),
            deleting=bool(meta.get("deletionTimestamp")),
            template=template,
            owners=tuple(Owner.from_dict(o, d.join("spec.owners", i)) for i, o in enumerate(owners)),
            ttl=ttl,
            expires=expires,
            allocate_once=d.boolean(spec, "allocateOnce", "spec", default=True),
            policy=policy,
            unschedulable=d.boolean(spec, "unschedulable", "spec"),
            taints=taints,
            pre_allocation=d.boolean(spec, "preAllocation", "spec"),
            phase=phase,
            node=d.string(status, "nodeName", "status"),
            conditions=_conditions(status),
            allocatable=_resources(status, "allocatable", "status"),
            current_owners=_owner_refs(status),
            reserved=reserved,
        )

    # -- derived -----------------------------------------------------------------------------------

    @property
    def restricted(self) -> bool:
        return self.policy == RESTRICTED

    @property
    def gang(self) -> str:
        """The gang of reservations this one belongs to ("" for none)."""
        return self.labels.get(GANG, "")

    @property
    def gang_size(self) -> int:
        try:
            return max(1, int(self.annotations.get(GANG_SIZE, "1")))
        except ValueError:
            return 1

    def expiry(self) -> float:
        """When the room is given back by age (seconds since the epoch; inf: never)."""
        if self.expires is not None:
            return self.expires
        if self.ttl is None or self.created is None:
            return math.inf
        return self.created + self.ttl

    def condition(self, kind: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    def template_pod(self) -> dict[str, Any]:
        """The pod the room is held for, as the allocator's request parser reads a pod: the
        template's labels and annotations with the Reservation's own on top (as Koordinator's
        reserve pod), minus the Reservation's `device-allocated` (its record of the room, not a
        designated allocation)."""
        meta = d.obj(self.template.get("metadata") or {}, "spec.template.metadata")
        spec = dict(self.template.get("spec") or {})
        spec["containers"] = [
            _without_pod_count(c) for c in spec.get("containers") or [] if isinstance(c, dict)
        ]
        annotations = {**(meta.get("annotations") or {}), **self.annotations}
        annotations.pop(keys.DEVICE_ALLOCATED, None)
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"reservation-{self.name}",
                "namespace": meta.get("namespace") or "default",
                "uid": self.uid,
                "labels": {**(meta.get("labels") or {}), **self.labels},
                "annotations": annotations,
            },
            "spec": spec,
        }

    def pod_limit(self) -> int | None:
        """The most owners the room takes (a template request `pods: N`); None: no limit."""
        total = 0
        found = False
        for c in (self.template.get("spec") or {}).get("containers") or []:
            requests = ((c or {}).get("resources") or {}).get("requests") or {}
            if isinstance(requests, dict) and POD_COUNT in requests:
                found = True
                total += Quantity.parse(requests[POD_COUNT], "spec.template...requests.pods").value()
        return total if found else None


def _without_pod_count(container: Mapping[str, Any]) -> dict[str, Any]:
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return dict(container)
    cleaned = {
        k: {n: q for n, q in v.items() if n != POD_COUNT} if isinstance(v, dict) else v
        for k, v in resources.items()
    }
    return {**container, "resources": cleaned}


def _taint(value: Any, path: str) -> Mapping[str, Any]:
    data = d.struct(value, path, ("key", "value", "effect"))
    key = d.string(data, "key", path, required=True)
    effect = d.one_of(
        d.string(data, "effect", path, required=True),
        ("NoSchedule", "PreferNoSchedule", "NoExecute"),
        d.join(path, "effect"),
    )
    return {"key": key, "value": d.string(data, "value", path), "effect": effect}


def _conditions(status: Mapping[str, Any]) -> tuple[Condition, ...]:
    out = []
    for i, c in enumerate(d.array(status, "conditions", "status")):
        path = d.join("status.conditions", i)
        data = d.struct(c, path, ("type", "status", "reason", "message"))
        out.append(
            Condition(
                d.string(data, "type", path),
                d.string(data, "status", path),
                d.string(data, "reason", path),
                d.string(data, "message", path),
            )
        )
    return tuple(out)


def _resources(data: Mapping[str, Any], name: str, path: str) -> dict[str, Quantity]:
    where = d.join(path, name)
    return {k: Quantity.parse(v, d.join(where, k)) for k, v in d.obj(data.get(name) or {}, where).items()}


def _owner_refs(status: Mapping[str, Any]) -> tuple[Mapping[str, str], ...]:
    out = []
    for i, ref in enumerate(d.array(status, "currentOwners", "status")):
        path = d.join("status.currentOwners", i)
        data = d.struct(ref, path, ("namespace", "name", "uid"))
        out.append({k: d.string(data, k, path) for k in ("namespace", "name", "uid")})
    return tuple(out)
