"""The gang controller's writes to the API server: a member's gate removed, its planned node
annotated, a PodGroup's status (either API's), a hold's record; and the Events it records. Each
write is guarded (uid test, JSON patch tests) so it never lands on a pod that was replaced; a
refusal is logged by the client and reported, and the next pass decides again."""

from __future__ import annotations

from typing import Any

from allocator.core.actions import ObjectRef
from allocator.core.gang.view import MemberPod
from allocator.runtime import gates
from allocator.runtime.events import EventSink, PodRef
from allocator.runtime.kube import MERGE_PATCH, STRATEGIC_MERGE_PATCH, KubeApi
from apis import keys
from apis import workload as wl
from apis.gang_object import native_conditions
from apis.kinds import NATIVE_PODGROUPS, PODGROUPS, PODS

JSON = dict[str, Any]


async def remove_gate(api: KubeApi, m: MemberPod) -> bool:
    """Remove the gang's scheduling gate from `m` (and only from this pod: uid tested). False when
    the API refused it."""
    return await gates.remove_gate(api, m, keys.GANG_SCHEDULING_GATE)


def _annotation(m: MemberPod | ObjectRef, key: str, value: str | None) -> JSON:
    """A merge patch of one annotation, with the member's uid as its precondition."""
    return {"metadata": {"uid": m.uid, "annotations": {key: value}}}


async def annotate_planned_node(api: KubeApi, m: ObjectRef, node: str) -> None:
    await api.patch(
        PODS.path(m.name, namespace=m.namespace),
        _annotation(m, keys.GANG_PLANNED_NODE, node),
        what=f"annotating {m.key} with its planned node",
    )


def status_patch(target: ObjectRef, status: JSON) -> tuple[str, JSON, str]:
    """The path, body and patch type that write the gang's status onto its PodGroup's status.

    A scheduler-plugins PodGroup takes it as a merge patch. A native PodGroup keeps conditions
    only, kube-scheduler's among them: topoalloc's go in under their own types as a strategic merge
    patch, which merges the list by type (a merge patch would replace kube-scheduler's)."""
    if target.api_version == wl.PODGROUP_API_VERSION:
        path = NATIVE_PODGROUPS.path(target.name, namespace=target.namespace, subresource="status")
        return path, {"status": {"conditions": native_conditions(status)}}, STRATEGIC_MERGE_PATCH
    path = PODGROUPS.path(target.name, namespace=target.namespace, subresource="status")
    return path, {"status": status}, MERGE_PATCH


async def patch_podgroup_status(api: KubeApi, target: ObjectRef, status: JSON) -> bool:
    """Write the gang's status onto its PodGroup's status subresource. False when the API refused it."""
    path, body, kind = status_patch(target, status)
    what = f"updating the status of {target.kind} {target.namespace}/{target.name}"
    return bool(await api.patch(path, body, content_type=kind, what=what))


def event_ref(target: ObjectRef) -> PodRef:
    """The object an Event of the gang lifecycle is about: the gang's object, or a member pod."""
    return PodRef(target.namespace, target.name, target.uid, target.kind, target.api_version)


def record_event(events: EventSink, target: ObjectRef, type_: str, reason: str, note: str) -> None:
    events.record(event_ref(target), type_, reason, "Scheduling", note)


async def annotate_hold(api: KubeApi, m: MemberPod, record: str) -> None:
    """Record a held room on a member (gang/hold_record.py); uid precondition."""
    await api.patch(
        PODS.path(m.name, namespace=m.namespace),
        _annotation(m, keys.GANG_HOLD, record),
        what=f"recording the gang hold on {m.key}",
    )


async def clear_hold(api: KubeApi, key: str, uid: str) -> None:
    namespace, _, name = key.partition("/")
    patch = {"metadata": {"uid": uid, "annotations": {keys.GANG_HOLD: None}}}
    # A member gone meanwhile has no hold left to clear.
    await api.patch(
        PODS.path(name, namespace=namespace), patch, what=f"clearing the gang hold of {key}", quiet=(404,)
    )
