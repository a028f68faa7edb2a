"""One gang model over its three API sources: what the gang planner and the gang status need of the
object that defines a gang, whichever it is.

* scheduler-plugins: a `scheduling.x-k8s.io/v1alpha1` PodGroup; size `minMember`; topoalloc writes
  its status (phase, counts, conditions);
* native (1.36): a `scheduling.k8s.io/v1alpha2` PodGroup; size `schedulingPolicy.gang.minCount`;
  topoalloc writes conditions of its own types (`topoalloc.io/Waiting`, ...) into its status;
* workload (1.35): a pod group of a `scheduling.k8s.io/v1alpha1` Workload; size
  `policy.gang.minCount`; no status (a Workload has none): Events only.

A `basic` policy (members placed one by one) is a gang of 1. The status is kept in
scheduler-plugins' terms (`PodGroupStatus`) whatever the source; `native_conditions` and
`status_of_native` translate it for a native PodGroup, whose status holds conditions only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apis import podgroup as pg
from apis import workload as wl
from apis.errors import CodecError
from apis.quantity import Quantity

JSON = dict[str, Any]


@dataclass(frozen=True)
class GangObject:
    source: str  # pg.PODGROUP_SOURCE, pg.NATIVE_SOURCE or pg.WORKLOAD_SOURCE
    namespace: str
    name: str  # the object's own name (Events are about it)
    kind: str
    api_version: str
    min_member: int
    min_resources: Mapping[str, Quantity] = field(default_factory=dict)
    timeout: int | None = None  # scheduleTimeoutSeconds (scheduler-plugins only)
    status: pg.PodGroupStatus = field(default_factory=pg.PodGroupStatus)
    annotations: Mapping[str, str] = field(default_factory=dict)
    gang: bool = True  # False: the basic policy
    uid: str = ""  # its metadata.uid: Events carry it, so `kubectl describe` lists them

    @property
    def has_status(self) -> bool:
        """topoalloc writes its status (and reads back what it wrote: a timed-out gang stays so)."""
        return self.source != pg.WORKLOAD_SOURCE

    @property
    def records_start(self) -> bool:
        """Its status keeps when the gang first had its minimum (`scheduleStartTime`)."""
        return self.source == pg.PODGROUP_SOURCE


def gang_object(ref: pg.GangRef, raw: JSON) -> GangObject:
    """The gang `ref` as its object `raw` defines it. Raises CodecError for a malformed object, or
    a Workload without the pod group the members name."""
    if ref.source == pg.NATIVE_SOURCE:
        return of_native(wl.NativePodGroup.from_dict(raw), ref.namespace)
    if ref.source == pg.WORKLOAD_SOURCE:
        return of_workload(wl.WorkloadV1Alpha1.from_dict(raw), ref.namespace, ref.pod_group)
    return of_podgroup(pg.PodGroup.from_dict(raw), ref.namespace)


def read_gang_object(
    ref: pg.GangRef, stores: Mapping[str, Mapping[str, JSON]]
) -> tuple[GangObject | None, JSON | None, str]:
    """The gang's object looked up in `stores` (source -> NS/NAME -> the object as read): decoded,
    as read, and why there is none to plan by ("" for a Koordinator gang, which has none)."""
    if ref.source == pg.KOORDINATOR_SOURCE:
        return None, None, ""
    what = {
        pg.NATIVE_SOURCE: f"PodGroup ({wl.PODGROUP_API_VERSION})",
        pg.WORKLOAD_SOURCE: f"Workload ({wl.WORKLOAD_API_VERSION})",
    }.get(ref.source, "PodGroup")
    raw = (stores.get(ref.source) or {}).get(ref.object_key)
    if raw is None:
        return None, None, f"{what} {ref.object_key} does not exist"
    try:
        return gang_object(ref, raw), raw, ""
    except CodecError as exc:
        return None, raw, f"{what} {ref.object_key} is invalid: {exc}"


def of_podgroup(group: pg.PodGroup, namespace: str) -> GangObject:
    return GangObject(
        pg.PODGROUP_SOURCE,
        group.namespace or namespace,
        group.name,
        pg.KIND,
        pg.API_VERSION,
        max(1, group.min_member),
        dict(group.min_resources),
        group.schedule_timeout_seconds,
        group.status,
        _annotations(group.metadata),
        uid=_uid(group.metadata),
    )


def of_native(group: wl.NativePodGroup, namespace: str) -> GangObject:
    return GangObject(
        pg.NATIVE_SOURCE,
        str(group.metadata.get("namespace") or namespace),
        group.name,
        wl.PODGROUP_KIND,
        wl.PODGROUP_API_VERSION,
        group.policy.min_count or 1,
        status=status_of_native(group.conditions),
        annotations=_annotations(group.metadata),
        gang=group.policy.gang,
        uid=_uid(group.metadata),
    )


def of_workload(workload: wl.WorkloadV1Alpha1, namespace: str, pod_group: str) -> GangObject:
    policy = workload.pod_groups.get(pod_group)
    if policy is None:
        known = ", ".join(sorted(workload.pod_groups)) or "none"
        why = f"has no pod group {pod_group!r} (it has {known})"
        raise CodecError("spec.podGroups", why, None, show_value=False)
    return GangObject(
        pg.WORKLOAD_SOURCE,
        str(workload.metadata.get("namespace") or namespace),
        workload.name,
        wl.WORKLOAD_KIND,
        wl.WORKLOAD_API_VERSION,
        policy.min_count or 1,
        annotations=_annotations(workload.metadata),
        gang=policy.gang,
        uid=_uid(workload.metadata),
    )


def native_conditions(status: Mapping[str, Any]) -> list[JSON]:
    """A status in scheduler-plugins' terms as the conditions topoalloc keeps on a native PodGroup:
    its own condition types, prefixed (`topoalloc.io/Waiting`); phase and counts have no field there."""
    out = []
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type"):
            out.append({**cond, "type": wl.CONDITION_PREFIX + str(cond["type"])})
    return out


def status_of_native(conditions: list[JSON]) -> pg.PodGroupStatus:
    """What topoalloc wrote to a native PodGroup read back in scheduler-plugins' terms: its own
    conditions (kube-scheduler's are left out) and `Failed` when its TimedOut condition holds."""
    ours = []
    for cond in conditions:
        kind = cond.get("type")
        if isinstance(kind, str) and kind.startswith(wl.CONDITION_PREFIX):
            ours.append({**cond, "type": kind.removeprefix(wl.CONDITION_PREFIX)})
    timed_out = any(c["type"] == "TimedOut" and c.get("status") == "True" for c in ours)
    return pg.PodGroupStatus(phase="Failed" if timed_out else "", conditions=ours)


def _annotations(metadata: Mapping[str, Any]) -> dict[str, str]:
    raw = metadata.get("annotations")
    return {k: v for k, v in raw.items() if isinstance(v, str)} if isinstance(raw, dict) else {}


def _uid(metadata: Mapping[str, Any]) -> str:
    uid = metadata.get("uid")
    return uid if isinstance(uid, str) else ""
