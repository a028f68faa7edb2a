"""The status the Reservation controller writes, as Koordinator's controller writes it: phase,
nodeName, allocatable, allocated, currentOwners and the Scheduled / Ready conditions."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from allocator.reservations.book import Entry
from allocator.reservations.writes import condition, conditions_with
from allocator.runtime.cache.records import PodEntry
from allocator.runtime.coreadapter import PodRequest
from apis import keys
from apis import reservation as rv
from apis.annotations import DeviceAllocations
from apis.errors import CodecError
from apis.quantity import Format, Quantity
from apis.reservation_pod import RESOURCE_STATUS

JSON = dict[str, Any]
DEVICE_ALLOCATED = keys.DEVICE_ALLOCATED
_MILLI = 10**6  # nano-units per milli-unit


def _current(raw: Mapping[str, Any]) -> list[JSON]:
    status = raw.get("status") if isinstance(raw.get("status"), dict) else {}
    found = status.get("conditions") if isinstance(status, dict) else None
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


def invalid(entry: Entry) -> JSON:
    return {
        "phase": rv.PENDING,
        "conditions": conditions_with(
            _current(entry.raw), condition(rv.SCHEDULED, False, "Invalid", entry.error)
        ),
    }


def unschedulable(res: rv.Reservation, message: str, reason: str = "Unschedulable") -> JSON:
    return {
        "phase": rv.PENDING,
        "conditions": conditions_with(_conditions(res), condition(rv.SCHEDULED, False, reason, message)),
    }


def available(res: rv.Reservation, node: str, req: PodRequest | None, now: float) -> JSON:
    return {
        "phase": rv.AVAILABLE,
        "nodeName": node,
        "allocatable": allocatable(res, req),
        "conditions": [
            condition(rv.SCHEDULED, True, "Scheduled", now=now),
            condition(rv.READY, True, "Available", now=now),
        ],
    }


def expired(res: rv.Reservation, now: float) -> JSON:
    return {
        "phase": rv.FAILED,
        "conditions": conditions_with(_conditions(res), condition(rv.READY, False, "Expired", now=now)),
    }


def failed(res: rv.Reservation, reason: str, message: str, now: float) -> JSON:
    return {
        "phase": rv.FAILED,
        "conditions": conditions_with(_conditions(res), condition(rv.READY, False, reason, message, now)),
    }


def succeeded(res: rv.Reservation, pods: Mapping[str, PodEntry], owners: list[str], now: float) -> JSON:
    return {
        "phase": rv.SUCCEEDED,
        **owners_status(pods, owners),
        "conditions": conditions_with(_conditions(res), condition(rv.READY, False, "Succeeded", now=now)),
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


def owners_status(pods: Mapping[str, PodEntry], owners: list[str]) -> JSON:
    """currentOwners and allocated (cpu, memory and the owner count) of the bound owners."""
    refs = []
    cpu = mem = 0
    for key in owners:
        pod = pods.get(key)
        if pod is None:
            continue
        namespace, _, name = key.partition("/")
        refs.append({"namespace": namespace, "name": name, "uid": pod.uid})
        if pod.usage is not None:
            cpu, mem = cpu + pod.usage.cpu_milli, mem + pod.usage.memory
    allocated: dict[str, str] = {}
    if refs:
        allocated[rv.POD_COUNT] = str(len(refs))
        if cpu:
            allocated["cpu"] = str(Quantity(cpu * _MILLI))
        if mem:
            allocated["memory"] = str(Quantity.of(mem, Format.BINARY_SI))
    return {"currentOwners": refs or None, "allocated": dict(sorted(allocated.items())) or None}


def owners_of(raw: Mapping[str, Any]) -> JSON:
    """The currentOwners and allocated the object says now (to compare with `owners_status`)."""
    status = raw.get("status") if isinstance(raw.get("status"), dict) else {}
    refs = [
        {k: str(r.get(k) or "") for k in ("namespace", "name", "uid")}
        for r in (status.get("currentOwners") or [])
        if isinstance(r, dict)
    ]
    allocated = status.get("allocated") if isinstance(status.get("allocated"), dict) else {}
    return {"currentOwners": refs or None, "allocated": dict(sorted(allocated.items())) or None}


def numa_annotations(entry: Entry, numa: int | None) -> dict[str, str]:
    """Koordinator's resource-status naming the NUMA node whose cpu and memory go with the room's
    devices (a SingleNUMANode template); written on the Reservation and on each owner."""
    if numa is None or entry.req is None:
        return {}
    resources = {}
    if entry.req.cpu_milli:
        resources["cpu"] = str(Quantity(entry.req.cpu_milli * _MILLI))
    if entry.req.memory:
        resources["memory"] = str(Quantity.of(entry.req.memory, Format.BINARY_SI))
    value = {"numaNodeResources": [{"node": numa, "resources": resources}]}
    return {RESOURCE_STATUS: json.dumps(value, separators=(",", ":"))}


def describe(allocations: DeviceAllocations) -> str:
    parts = [
        f"{len(entries)} {dtype} ({', '.join(str(a.minor) for a in entries)})"
        for dtype, entries in sorted(allocations.by_type.items())
        if entries
    ]
    return ", ".join(parts) or "no devices"
