"""Admission of a pod that reached this node without an allocation for it: whether it is one, what
the node's devices hold by the agent's journal, and the expectation (expectation.py) a container
of it gets from the devices the node chooses (node_choice.py).

A pod has no allocation for this node when it has no `device-allocated` annotation, or when its
`allocated-node` annotation names another node. Once the node chose for one of its containers it
stays the node's to choose for (the annotation the agent writes after the first container names
this node, but holds only what was served so far).

Pure: pods, served state and inventory in, plain data out.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from agent.deviceplugin.expectation import ContainerExpectation, ExpectationError, expectations
from agent.deviceplugin.inventory import Inventory, base_of
from agent.deviceplugin.node_choice import NodeUse, Offered, plan_pod
from agent.deviceplugin.node_request import GPU, RDMA, pod_ask
from agent.deviceplugin.served import ServedPod
from apis import keys
from apis import resources as rn
from apis.annotations import DeviceAllocations, allocated_elsewhere, parse_device_allocated
from apis.errors import CodecError

NO_ANNOTATION = f"it has no {keys.DEVICE_ALLOCATED} annotation"


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def why_node_chooses(pod: Mapping[str, Any], node: str, served: ServedPod | None) -> str:
    """Why the node chooses this pod's devices; "" when the pod carries an allocation for it."""
    if served is not None and served.why:
        return served.why
    annotations = _annotations(pod)
    if keys.DEVICE_ALLOCATED not in annotations:
        return NO_ANNOTATION
    other = allocated_elsewhere(annotations, node)
    return f"its {keys.DEVICE_ALLOCATED} annotation was made for node {other}" if other else ""


def allocation_here(pod: Mapping[str, Any] | None, node: str) -> DeviceAllocations | None:
    """The pod's device-allocated annotation when it applies on this node and parses."""
    if pod is None:
        return None
    annotations = _annotations(pod)
    text = annotations.get(keys.DEVICE_ALLOCATED)
    if not isinstance(text, str) or allocated_elsewhere(annotations, node):
        return None
    try:
        return parse_device_allocated(text)
    except CodecError:
        return None


def node_use(
    inv: Inventory, served: Mapping[str, ServedPod], pods: Iterable[Mapping[str, Any]], node: str, uid: str
) -> NodeUse:
    """What this node's devices hold for pods other than `uid`: every served pod by its kubelet
    IDs (memory shares and VFs from its allocation), and, as devices to leave alone while others
    are free, those annotated to this node's unfinished pods that were not served yet."""
    by_uid = {_uid(p): p for p in pods}
    use = NodeUse()
    for u, s in served.items():
        if u != uid:
            use.add_held(inv, s.resources, s.allocations() or allocation_here(by_uid.get(u), node))
    for u, pod in by_uid.items():
        if u == uid or u in served or (pod.get("status") or {}).get("phase") in rn.TERMINAL_POD_PHASES:
            continue
        awaited = allocation_here(pod, node)
        if awaited is not None:
            use.awaited_gpus.update(awaited.minors(GPU))
            use.awaited_nics.update(awaited.minors(RDMA))
    return use


def offered_units(resource: str, ids: Iterable[str]) -> dict[str, int]:
    """IDs per base device (GPU UUID, PF address)."""
    out: dict[str, int] = {}
    for device_id in ids:
        base = base_of(resource, device_id)
        out[base] = out.get(base, 0) + 1
    return out


def chosen_expectation(
    pod: dict[str, Any],
    resource: str,
    container: int,
    why: str,
    inv: Inventory,
    use: NodeUse,
    served: ServedPod | None,
    offered: Offered | None,
) -> ContainerExpectation:
    """What the container gets of `resource` from the devices the node chooses for the pod (what
    its containers were served is kept). Raises ExpectationError (NoRoom: nothing fits now)."""
    ask = pod_ask(pod)
    plan = plan_pod(ask, inv, use, served.fixed() if served is not None else {}, offered)
    placed = copy.deepcopy(pod)
    placed.setdefault("metadata", {})["annotations"] = {
        **_annotations(pod),
        keys.DEVICE_ALLOCATED: plan.allocations().to_json(),
    }
    return dataclasses.replace(expectations(placed, resource, inv)[container], why=why)


def refusal(why: str, exc: ExpectationError) -> str:
    return f"{why} and this node cannot serve it: {exc}"
