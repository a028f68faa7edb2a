"""The status the Reservation lifecycle writes, as Koordinator's controller writes it: phase,
nodeName, allocatable, allocated, currentOwners and the Scheduled / Ready conditions. Pure: every
condition is stamped with the `now` it is given."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from allocator.core.request.pod_request import PodRequest
from apis import reservation as rv
from apis.annotations import DeviceAllocations
from apis.errors import CodecError
from apis.quantity import Format, Quantity
from apis.reservation_pod import RESOURCE_STATUS
from apis.timestamps import format_time

JSON = dict[str, Any]
_MILLI = 10**6  # nano-units per milli-unit


@dataclass(frozen=True)
class OwnerPod:
    """A bound owner as the status counts it."""

    key: str  # namespace/name
    uid: str
    cpu_milli: int = 0
    memory: int = 0


def condition(kind: str, status: bool, reason: str, message: str, now: float) -> JSON:
    stamp = format_time(now)
    out: JSON = {"type": kind, "status": "True" if status else "False", "reason": reason}
    if message:
        out["message"] = message
    out["lastProbeTime"] = stamp
    out["lastTransitionTime"] = stamp
    return out


def conditions_with(current: list[JSON], *new: JSON) -> list[JSON]:
    """`current` with each of `new` in place of the condition of its type (kept in order)."""
    kinds = {c["type"] for c in new}
    kept = [c for c in current if isinstance(c, dict) and c.get("type") not in kinds]
    return kept + list(new)


def _current(status: Mapping[str, Any]) -> list[JSON]:
    found = status.get("conditions")
    return [c for c in found or [] if isinstance(c, dict)]


def _conditions(res: rv.Reservation) -> list[JSON]:
    return [
        {
            "type": c.type,
            "status": c.status,
            "reason": c.reason,
            **({"message": c.message} if c.message else {}),
        }
        for c in res.conditions
    ]


def invalid(status: Mapping[str, Any], error: str, now: float) -> JSON:
    """A Reservation that does not decode: `status` is what the object says now (its conditions
    are kept)."""
    return {
        "phase": rv.PENDING,
        "conditions": conditions_with(
            _current(status), condition(rv.SCHEDULED, False, "Invalid", error, now)
        ),
    }


def unschedulable(res: rv.Reservation, message: str, now: float, reason: str = "Unschedulable") -> JSON:
    return {
        "phase": rv.PENDING,
        "conditions": conditions_with(_conditions(res), condition(rv.SCHEDULED, False, reason, message, now)),
    }


def available(res: rv.Reservation, node: str, req: PodRequest | None, now: float) -> JSON:
    return {
        "phase": rv.AVAILABLE,
        "nodeName": node,
        "allocatable": allocatable(res, req),
        "conditions": [
            condition(rv.SCHEDULED, True, "Scheduled", "", now),
            condition(rv.READY, True, "Available", "", now),
        ],
    }


def expired(res: rv.Reservation, now: float) -> JSON:
    return {
        "phase": rv.FAILED,
        "conditions": conditions_with(_conditions(res), condition(rv.READY, False, "Expired", "", now)),
    }


def failed(res: rv.Reservation, reason: str, message: str, now: float) -> JSON:
    return {
        "phase": rv.FAILED,
        "conditions": conditions_with(_conditions(res), condition(rv.READY, False, reason, message, now)),
    }


def succeeded(res: rv.Reservation, owners: Sequence[OwnerPod], now: float) -> JSON:
    return {
        "phase": rv.SUCCEEDED,
        **owners_status(owners),
        "conditions": conditions_with(_conditions(res), condition(rv.READY, False, "Succeeded", "", now)),
    }


def allocatable(res: rv.Reservation, req: PodRequest | None) -> dict[str, str]:
    """What the room reserves, as a ResourceList (the template's requests, `pods` included)."""
    out: dict[str, str] = {}
    if req is not None:
        if req.cpu_milli:
            out["cpu"] = str(Quantity(req.cpu_milli * _MILLI))
        if req.memory:
            out["memory"] = str(Quantity.of(req.memory, Format.BINARY_SI))
        for name, value in req.scalars.items():
            out[name] = str(Quantity.of(value))
    try:
        limit = res.pod_limit()
    except CodecError:
        limit = None
    if limit is not None:
        out[rv.POD_COUNT] = str(limit)
    return dict(sorted(out.items()))


def owners_status(owners: Sequence[OwnerPod]) -> JSON:
    """currentOwners and allocated (cpu, memory and the owner count) of the bound owners."""
    refs = []
    cpu = mem = 0
    for pod in owners:
        namespace, _, name = pod.key.partition("/")
        refs.append({"namespace": namespace, "name": name, "uid": pod.uid})
        cpu, mem = cpu + pod.cpu_milli, mem + pod.memory
    allocated: dict[str, str] = {}
    if refs:
        allocated[rv.POD_COUNT] = str(len(refs))
        if cpu:
            allocated["cpu"] = str(Quantity(cpu * _MILLI))
        if mem:
            allocated["memory"] = str(Quantity.of(mem, Format.BINARY_SI))
    return {"currentOwners": refs or None, "allocated": dict(sorted(allocated.items())) or None}


def owners_of(status: Mapping[str, Any]) -> JSON:
    """The currentOwners and allocated the object says now (to compare with `owners_status`)."""
    refs = [
        {k: str(r.get(k) or "") for k in ("namespace", "name", "uid")}
        for r in (status.get("currentOwners") or [])
        if isinstance(r, dict)
    ]
    allocated = status.get("allocated") if isinstance(status.get("allocated"), dict) else {}
    return {"currentOwners": refs or None, "allocated": dict(sorted(allocated.items())) or None}


def numa_annotations(req: PodRequest | None, numa: int | None) -> dict[str, str]:
    """Koordinator's resource-status naming the NUMA node whose cpu and memory go with the room's
    devices (a SingleNUMANode template); written on the Reservation and on each owner."""
    if numa is None or req is None:
        return {}
    resources = {}
    if req.cpu_milli:
        resources["cpu"] = str(Quantity(req.cpu_milli * _MILLI))
    if req.memory:
        resources["memory"] = str(Quantity.of(req.memory, Format.BINARY_SI))
    value = {"numaNodeResources": [{"node": numa, "resources": resources}]}
    return {RESOURCE_STATUS: json.dumps(value, separators=(",", ":"))}


def describe(allocations: DeviceAllocations) -> str:
    parts = [
        f"{len(entries)} {dtype} ({', '.join(str(a.minor) for a in entries)})"
        for dtype, entries in sorted(allocations.by_type.items())
        if entries
    ]
    return ", ".join(parts) or "no devices"
