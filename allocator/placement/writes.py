"""Placement's writes to the API server: the node a placed pod is to be bound to, its recorded
allocation and the gate's removal; the recorded allocation cleared; the pod's placement condition.

Two ways to pin a pod to its node (docs/placement.md has the measurements, bench/pinning.py):
* `affinity`: ONE JSON patch adds a required node affinity term `metadata.name In [node]` (to every
  term the pod has, so it only narrows: kube-apiserver accepts that while the pod is gated), the
  annotations and the gate's removal. Exact, and the cheapest; but the term cannot change once the
  gate is gone, so a pod refused there is created anew by its controller (lifecycle `Replace`).
* `nominate`: the pod's `status.nominatedNodeName` first (kube-scheduler tries a nominated node
  first and binds elsewhere when it does not fit), then one JSON patch with the annotations and the
  gate's removal. Two writes; never stuck. A pod ungated before it is nominated could be bound
  anywhere, hence this order.
`auto` pins by affinity a pod that has a controller or a pod group of Kubernetes' own (kube-scheduler
clears the nomination of a member whose group is not all there yet), by nomination any other.
Every JSON patch tests the pod's uid (never a re-created pod of the name) and the gate where it was read.
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


AFFINITY = "affinity"
NOMINATE = "nominate"
AUTO = "auto"
PIN_MODES = (AUTO, AFFINITY, NOMINATE)
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
TERMS = f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms"


def pin_of(pod: JSON, mode: str) -> str:
    """How `pod` is pinned under the setting `mode` (auto: by affinity when it has a controller or
    kube-scheduler schedules it with its pod group, else by nomination)."""
    if mode != AUTO:
        return mode
    return AFFINITY if controller_of(pod) or in_pod_group(pod) else NOMINATE


def in_pod_group(pod: JSON) -> bool:
    """Whether kube-scheduler schedules the pod with its pod group (Kubernetes' own gangs:
    spec.schedulingGroup, spec.workloadRef). It clears the nominated node of a member whose group
    is not all there yet, so a nomination would not hold until the group is whole."""
    spec = pod.get("spec") or {}
    return bool(spec.get("schedulingGroup") or spec.get("workloadRef"))


def controller_of(pod: JSON) -> str:
    """The uid of the pod's controller ("" none)."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return str(ref.get("uid") or "")
    return ""


def node_field(node: str) -> JSON:
    return {"key": "metadata.name", "operator": "In", "values": [node]}


def pinned_to(pod: JSON, node: str) -> bool:
    """Whether every required node affinity term of `pod` holds placement's term for `node`."""
    required = (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}).get(REQUIRED)
    terms = (required or {}).get("nodeSelectorTerms") or []
    return bool(node) and bool(terms) and all(node_field(node) in (t.get("matchFields") or []) for t in terms)


def affinity_ops(pod: JSON, node: str) -> list[JSON]:
    """JSON patch operations narrowing the pod's required node affinity to `node`."""
    wanted = node_field(node)
    spec = pod.get("spec") or {}
    affinity = spec.get("affinity")
    if not isinstance(affinity, dict):
        term = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchFields": [wanted]}]}}}
        return [{"op": "add", "path": "/spec/affinity", "value": term}]
    node_affinity = affinity.get("nodeAffinity")
    if not isinstance(node_affinity, dict):
        value = {REQUIRED: {"nodeSelectorTerms": [{"matchFields": [wanted]}]}}
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity", "value": value}]
    required = node_affinity.get(REQUIRED)
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if not terms:
        value = {"nodeSelectorTerms": [{"matchFields": [wanted]}]}
        return [{"op": "add", "path": f"/spec/affinity/nodeAffinity/{REQUIRED}", "value": value}]
    ops = []
    for i, term in enumerate(terms):
        if isinstance(term, dict) and term.get("matchFields"):
            ops.append({"op": "add", "path": f"{TERMS}/{i}/matchFields/-", "value": wanted})
        else:
            ops.append({"op": "add", "path": f"{TERMS}/{i}/matchFields", "value": [wanted]})
    return ops


async def write_placement(
    api: KubeApi,
    pod: JSON,
    ref: ObjectRef,
    node: str,
    annotations: Mapping[str, str],
    *,
    ungate: bool,
    pin: str = NOMINATE,
) -> Result:
    """Pin the pod to `node` (`pin`: affinity or nominate; a pod no longer gated can only be
    nominated) and record the allocation; with `ungate`, remove the gate."""
    ops = [{"op": "test", "path": "/metadata/uid", "value": ref.uid}]
    if pin == AFFINITY and ungate:
        ops += affinity_ops(pod, node)
    else:
        nominated = await api.patch(
            PODS.path(ref.name, namespace=ref.namespace, subresource="status"),
            {"metadata": {"uid": ref.uid}, "status": {"nominatedNodeName": node}},
            what=f"nominating {node} for {ref.key}",
        )
        if isinstance(nominated, Refused):
            return nominated
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
