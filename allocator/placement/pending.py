"""The pods placement looks after, kept from the watch cache's pod events: pending pods that carry
the placement gate or a recorded placement (`topoalloc.io/allocated-node`), and what a pass shows
the lifecycle of each (allocator/core/placement/view.py)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from allocator.core.actions import ObjectRef
from allocator.core.placement.view import PendingPod
from allocator.placement.writes import controller_of, pinned_to
from allocator.runtime.cache.records import PodEntry
from apis import keys
from apis.resources import TERMINAL_POD_PHASES

JSON = dict[str, Any]
UNSCHEDULABLE = ("PodScheduled", "False", "Unschedulable")


def placement_pod(obj: JSON | None, bind_for: Collection[str] = ()) -> bool:
    """Whether placement looks after `obj`: pending, not finishing, gated by placement or placed,
    or of a scheduler topoalloc binds for."""
    if obj is None:
        return False
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    if spec.get("nodeName") or meta.get("deletionTimestamp"):
        return False
    if (obj.get("status") or {}).get("phase") in TERMINAL_POD_PHASES:
        return False
    if spec.get("schedulerName") in bind_for:
        return True
    return keys.PLACEMENT_GATE in gate_names(obj) or keys.ALLOCATED_NODE in (meta.get("annotations") or {})


def gate_names(obj: JSON) -> tuple[str, ...]:
    gates = (obj.get("spec") or {}).get("schedulingGates") or []
    return tuple(g.get("name", "") for g in gates if isinstance(g, dict))


def pending_pod(entry: PodEntry, bind_for: Collection[str] = ()) -> PendingPod | None:
    """What the lifecycle is shown of a pod (None: gone from placement's care meanwhile)."""
    pod = entry.raw
    if pod is None or entry.node or entry.deleting or not placement_pod(pod, bind_for):
        return None
    meta = pod.get("metadata") or {}
    refusal, since = "", ""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == (
            "PodScheduled",
            "False",
            "Unschedulable",
        ):
            refusal, since = str(cond.get("message") or ""), str(cond.get("lastTransitionTime") or "")
    placed_on = str((meta.get("annotations") or {}).get(keys.ALLOCATED_NODE) or "")
    return PendingPod(
        ObjectRef(meta.get("namespace") or "default", meta.get("name") or "", entry.uid),
        priority=entry.priority,
        created=str(meta.get("creationTimestamp") or ""),
        gates=gate_names(pod),
        placed_on=placed_on,
        unschedulable=refusal,
        unschedulable_since=since,
        controller=controller_of(pod),
        pinned=pinned_to(pod, placed_on),
        binds_here=(pod.get("spec") or {}).get("schedulerName") in bind_for,
    )
