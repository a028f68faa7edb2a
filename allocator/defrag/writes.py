"""The migration controller's writes: a move's Reservation (the replacement's room on the target,
owned by the pod's controller, allocateOnce, labelled and annotated so a restarted leader reads the
move back), the mark that its pod was evicted, its closing, and the dry run's report ConfigMap.
A refused write is logged (by the client) and returns False: the next pass tries again."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from allocator.core.defrag.plan import Move
from allocator.defrag import reading as rd
from allocator.runtime.kube import KubeApi, Written
from apis import keys
from apis import reservation as rv
from apis.kinds import CONFIGMAPS, RESERVATIONS

JSON = dict[str, Any]
# What the replacement's room keeps of the pod's own annotations: its device asks.
KEPT_ANNOTATIONS = (keys.DEVICE_JOINT_ALLOCATE,)


def reservation_name(move: Move) -> str:
    """One name per pod incarnation: a second create for the same move is refused (409)."""
    digest = hashlib.sha256(f"{move.key}/{move.uid}".encode()).hexdigest()[:10]
    return f"defrag-{move.key.partition('/')[2][:40]}-{digest}".lower()


def reservation_body(move: Move, pod: JSON, unblocks: str, ttl: str) -> JSON:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    containers = [
        {"name": c.get("name", f"c{i}"), "resources": c.get("resources") or {}}
        for i, c in enumerate(spec.get("containers") or [])
    ]
    template_spec: JSON = {"nodeName": move.target, "containers": containers}
    for field in ("priority", "priorityClassName", "schedulerName", "tolerations"):
        if field in spec:
            template_spec[field] = spec[field]
    notes = meta.get("annotations") or {}
    owner: JSON = {}
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            owner = {"controller": {k: ref[k] for k in ("apiVersion", "kind", "name", "uid") if k in ref}}
            owner["controller"]["namespace"] = meta.get("namespace") or "default"
    if not owner:  # a bare pod (allowed by the settings): whoever recreates it with its labels
        owner = {"labelSelector": {"matchLabels": dict(meta.get("labels") or {})}}
    return {
        "apiVersion": f"{rv.GROUP}/{rv.VERSION}",
        "kind": "Reservation",
        "metadata": {
            "name": reservation_name(move),
            "labels": {rd.LABEL: "true"},
            "annotations": {
                rd.POD: move.key,
                rd.POD_UID: move.uid,
                rd.SOURCE: move.source,
                rd.TARGET: move.target,
                rd.WORKLOAD: move.workload,
                rd.UNBLOCKS: unblocks,
            },
        },
        "spec": {
            "template": {
                "metadata": {
                    "namespace": meta.get("namespace") or "default",
                    "annotations": {k: notes[k] for k in KEPT_ANNOTATIONS if k in notes},
                },
                "spec": template_spec,
            },
            "owners": [owner],
            "allocateOnce": True,
            "ttl": ttl,
        },
    }


async def create_reservation(api: KubeApi, body: JSON) -> bool:
    name = body["metadata"]["name"]
    got = await api.create(RESERVATIONS.path(), body, what=f"creating Reservation {name}", quiet=(409,))
    # 409: made already (a pass before a restart): the move goes on from it.
    return isinstance(got, Written) or got.status == 409


async def mark_evicted(api: KubeApi, name: str, uid: str) -> bool:
    patch = {"metadata": {"uid": uid, "annotations": {rd.EVICTED: "true"}}}
    return bool(await api.patch(RESERVATIONS.path(name), patch, what=f"marking Reservation {name} evicted"))


async def close_reservation(api: KubeApi, name: str, uid: str, reason: str, now: str) -> bool:
    """Mark a finished move and expire its Reservation now: the Reservation controller gives any
    room left back (the allocator's role deletes nothing; the object stays as a record)."""
    patch = {"metadata": {"uid": uid, "annotations": {rd.CLOSED: reason}}, "spec": {"expires": now}}
    what = f"closing Reservation {name}"
    got = await api.patch(RESERVATIONS.path(name), patch, what=what, quiet=(404,))
    return isinstance(got, Written) or got.status == 404  # gone: nothing left to close


async def write_report(api: KubeApi, namespace: str, name: str, report: JSON) -> bool:
    """The dry run's plan as a ConfigMap (`plan.json`), made or replaced."""
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"plan.json": json.dumps(report, indent=2, sort_keys=True)},
    }
    what = f"writing the defrag report {namespace}/{name}"
    return bool(await api.create_or_replace(CONFIGMAPS, body, what=what))
