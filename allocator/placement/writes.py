"""Placement's writes to the API server: the node a placed pod is to be bound to, its recorded
allocation and the gate's removal; the recorded allocation cleared; the pod's placement condition.

A placement is two writes, in this order: the pod's `status.nominatedNodeName` (kube-scheduler tries
a nominated node first, and binds elsewhere when it does not fit: bench/pinning.py, docs/placement.md
for why not a node affinity term), then one JSON patch with the annotations and the gate's removal,
testing the pod's uid (never a re-created pod of the name) and the gate where it was read. The
nomination first: a pod ungated before it is nominated could be bound anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from allocator.core.actions import ObjectRef
from allocator.runtime.answers import Refused, Result, Written
from allocator.runtime.gates import PodGates, gate_removal
from allocator.runtime.kube import JSON_PATCH, STRATEGIC_MERGE_PATCH, KubeApi
from apis import keys
from apis.kinds import PODS

JSON = dict[str, Any]


def annotation_ops(pod: JSON, annotations: Mapping[str, str | None]) -> list[JSON]:
    """JSON patch operations setting (None: removing) `annotations` on `pod` as read."""
    have = (pod.get("metadata") or {}).get("annotations")
    if not isinstance(have, dict):
        wanted = {k: v for k, v in annotations.items() if v is not None}
        return [{"op": "add", "path": "/metadata/annotations", "value": wanted}] if wanted else []
    ops: list[JSON] = []
    for key, value in annotations.items():
        path = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
        if value is not None:
            ops.append({"op": "add", "path": path, "value": value})
        elif key in have:
            ops.append({"op": "remove", "path": path})
    return ops


async def write_placement(
    api: KubeApi, pod: JSON, ref: ObjectRef, node: str, annotations: Mapping[str, str], *, ungate: bool
) -> Result:
    """Nominate `node`, then record the allocation (and, with `ungate`, remove the gate)."""
    nominated = await api.patch(
        PODS.path(ref.name, namespace=ref.namespace, subresource="status"),
        {"metadata": {"uid": ref.uid}, "status": {"nominatedNodeName": node}},
        what=f"nominating {node} for {ref.key}",
    )
    if isinstance(nominated, Refused):
        return nominated
    ops = [{"op": "test", "path": "/metadata/uid", "value": ref.uid}]
    ops += annotation_ops(pod, annotations)
    if ungate:
        gates = tuple(g.get("name", "") for g in (pod.get("spec") or {}).get("schedulingGates") or [])
        ops += gate_removal(PodGates(ref.namespace, ref.name, ref.uid, gates), keys.PLACEMENT_GATE)[1:]
    return await api.patch(
        PODS.path(ref.name, namespace=ref.namespace),
        ops,
        content_type=JSON_PATCH,
        what=f"writing the placement of {ref.key}",
    )


async def clear_placement(api: KubeApi, pod: JSON, ref: ObjectRef, recorded: tuple[str, ...]) -> Result:
    """Remove the pod's recorded allocation (the keys `recorded` names)."""
    ops = [{"op": "test", "path": "/metadata/uid", "value": ref.uid}]
    ops += annotation_ops(pod, dict.fromkeys(recorded))
    if len(ops) == 1:
        return Written({})
    return await api.patch(
        PODS.path(ref.name, namespace=ref.namespace),
        ops,
        content_type=JSON_PATCH,
        what=f"clearing the placement of {ref.key}",
    )


async def write_condition(api: KubeApi, ref: ObjectRef, status: JSON) -> Result:
    """Merge `status` (its conditions by type, as kube-scheduler's own PodScheduled stays)."""
    return await api.patch(
        PODS.path(ref.name, namespace=ref.namespace, subresource="status"),
        {"metadata": {"uid": ref.uid}, "status": status},
        content_type=STRATEGIC_MERGE_PATCH,
        what=f"the placement condition of {ref.key}",
        quiet=(404, 409),
    )
