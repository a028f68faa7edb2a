"""The gang controller's writes to the API server: a member's gate removed, its planned node
annotated, a PodGroup's status (either API's), a hold's record; and the Events it records. Each
write is guarded (uid test, JSON patch tests) so it never lands on a pod that was replaced; a
failure is logged and reported, and the next pass decides again."""

from __future__ import annotations

import logging
from typing import Any

from allocator.core.actions import ObjectRef
from allocator.core.gang.view import MemberPod
from allocator.runtime.events import EventSink, PodRef
from allocator.runtime.kube import MERGE_PATCH, STRATEGIC_MERGE_PATCH, ApiError, KubeApi
from apis import keys
from apis import podgroup as pg
from apis import workload as wl
from apis.gang_object import native_conditions

log = logging.getLogger(__name__)

JSON = dict[str, Any]
JSON_PATCH = "application/json-patch+json"


def pod_path(m: MemberPod) -> str:
    return f"/api/v1/namespaces/{m.namespace}/pods/{m.name}"


async def remove_gate(api: KubeApi, m: MemberPod) -> bool:
    """Remove the gang's scheduling gate from `m` (and only from this pod: uid tested). False when
    the API refused it."""
    index = m.gates.index(keys.GANG_SCHEDULING_GATE)
    ops: list[JSON] = [{"op": "test", "path": "/metadata/uid", "value": m.uid}]
    if len(m.gates) == 1:
        ops += [
            {
                "op": "test",
                "path": "/spec/schedulingGates",
                "value": [{"name": keys.GANG_SCHEDULING_GATE}],
            },
            {"op": "remove", "path": "/spec/schedulingGates"},
        ]
    else:
        ops += [
            {
                "op": "test",
                "path": f"/spec/schedulingGates/{index}/name",
                "value": keys.GANG_SCHEDULING_GATE,
            },
            {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
        ]
    try:
        await api.raw("PATCH", pod_path(m), body=ops, content_type=JSON_PATCH)
    except ApiError as exc:
        log.warning("removing the gang gate of %s: %s", m.key, exc)
        return False
    return True


async def annotate_planned_node(api: KubeApi, m: ObjectRef, node: str) -> None:
    patch = {"metadata": {"uid": m.uid, "annotations": {keys.GANG_PLANNED_NODE: node}}}
    try:
        await api.patch_pod(m.namespace, m.name, patch)
    except ApiError as exc:
        log.warning("annotating %s with its planned node: %s", m.key, exc)


async def patch_podgroup_status(api: KubeApi, target: ObjectRef, status: JSON) -> bool:
    """Write the gang's status onto its PodGroup's status subresource. False when the API refused it.

    A scheduler-plugins PodGroup takes it as a merge patch. A native PodGroup keeps conditions
    only, kube-scheduler's among them: topoalloc's go in under their own types as a strategic merge
    patch, which merges the list by type (a merge patch would replace kube-scheduler's)."""
    native = target.api_version == wl.PODGROUP_API_VERSION
    plural = wl.PODGROUPS if native else pg.PLURAL
    path = f"/apis/{target.api_version}/namespaces/{target.namespace}/{plural}/{target.name}/status"
    body, kind = {"status": status}, MERGE_PATCH
    if native:
        body, kind = {"status": {"conditions": native_conditions(status)}}, STRATEGIC_MERGE_PATCH
    try:
        await api.raw("PATCH", path, body=body, content_type=kind)
    except ApiError as exc:
        log.warning("updating the status of %s %s/%s: %s", target.kind, target.namespace, target.name, exc)
        return False
    return True


def event_ref(target: ObjectRef) -> PodRef:
    """The object an Event of the gang lifecycle is about: the gang's object, or a member pod."""
    return PodRef(target.namespace, target.name, target.uid, target.kind, target.api_version)


def record_event(events: EventSink, target: ObjectRef, type_: str, reason: str, note: str) -> None:
    events.record(event_ref(target), type_, reason, "Scheduling", note)


async def annotate_hold(api: KubeApi, m: MemberPod, record: str) -> None:
    """Record a held room on a member (gang/hold_record.py); uid precondition."""
    patch = {"metadata": {"uid": m.uid, "annotations": {keys.GANG_HOLD: record}}}
    try:
        await api.patch_pod(m.namespace, m.name, patch)
    except ApiError as exc:
        log.warning("recording the gang hold on %s: %s", m.key, exc)


async def clear_hold(api: KubeApi, key: str, uid: str) -> None:
    namespace, _, name = key.partition("/")
    patch = {"metadata": {"uid": uid, "annotations": {keys.GANG_HOLD: None}}}
    try:
        await api.patch_pod(namespace, name, patch)
    except ApiError as exc:
        if exc.status != 404:
            log.warning("clearing the gang hold of %s: %s", key, exc)
