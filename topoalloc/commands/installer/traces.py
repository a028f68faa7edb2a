"""What topoalloc leaves outside its own objects, and how to take it away: pure decisions on objects
read from the cluster (cleanup.py sends the requests).

* A Node the agent published to carries `topoalloc.io/device-mode` (set on every pass): only on such
  a node are the agent's other labels (Koordinator's GPU labels, kubelet's policies) and the extended
  resources in its status (koordinator.sh/gpu*, koordinator.sh/rdma, the mid-tier's) taken to be
  the agent's, so a node another system publishes to is left alone.
* ResourceSlices of topoalloc's DRA driver; DeviceClasses labelled part of topoalloc.
* topoalloc's scheduling gates (placement, gang, DRA): with the webhooks gone nothing would ever
  remove them, so the pod would wait for ever.
* What stays on purpose, said to the user: claims allocated from topoalloc's devices, Reservations
  still holding room, running pods whose devices topoalloc allocated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.publish.device_builder import NODE_LABELS, NODE_RESOURCES
from apis import dra, keys, kubelet_policy, reservation, resources

Obj = Mapping[str, Any]
JSON = dict[str, Any]

PART_OF = "app.kubernetes.io/part-of"
#: On every node the agent publishes to: the mark that the labels and resources below are its.
AGENT_MARK = dra.MODE_LABEL
AGENT_LABELS = (AGENT_MARK, *NODE_LABELS, *kubelet_policy.LABELS)
AGENT_RESOURCES = (*NODE_RESOURCES, resources.MID_CPU, resources.MID_MEMORY)
GATES = (keys.PLACEMENT_GATE, keys.GANG_SCHEDULING_GATE, dra.SCHEDULING_GATE)
HELD = (reservation.AVAILABLE,)
TERMINAL = ("Succeeded", "Failed")


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def key(obj: Obj) -> str:
    """`namespace/name`, or the name of a cluster-scoped object."""
    meta = _meta(obj)
    name = str(meta.get("name", ""))
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else name


def _pointer(name: str) -> str:
    """A JSON pointer segment (RFC 6901): `koordinator.sh/gpu` -> `koordinator.sh~1gpu`."""
    return name.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True)
class NodeTraces:
    """What the agent left on one Node: label keys, and extended resources in status."""

    name: str
    labels: tuple[str, ...]
    capacity: tuple[str, ...]
    allocatable: tuple[str, ...]

    @property
    def resources(self) -> tuple[str, ...]:
        return tuple(sorted({*self.capacity, *self.allocatable}))

    def status_patch(self, node: Obj) -> list[JSON]:
        """The JSON patch of the status subresource removing the resources, each tested at the value
        read (a kubelet write in between fails the patch instead of being undone blindly)."""
        status = node.get("status") or {}
        ops: list[JSON] = [{"op": "test", "path": "/metadata/uid", "value": _meta(node).get("uid")}]
        for field, names in (("capacity", self.capacity), ("allocatable", self.allocatable)):
            for name in names:
                path = f"/status/{field}/{_pointer(name)}"
                ops += [
                    {"op": "test", "path": path, "value": status[field][name]},
                    {"op": "remove", "path": path},
                ]
        return ops

    def label_patch(self) -> JSON:
        """The merge patch removing the labels (the mark last: it says the rest are the agent's)."""
        return {"metadata": {"labels": dict.fromkeys(self.labels)}}


def node_traces(node: Obj) -> NodeTraces | None:
    """The agent's traces on `node`, None when it has none (or is not marked as the agent's)."""
    labels = _meta(node).get("labels") or {}
    if AGENT_MARK not in labels:
        return None
    status = node.get("status") or {}
    capacity = status.get("capacity") or {}
    allocatable = status.get("allocatable") or {}
    return NodeTraces(
        name=str(_meta(node).get("name", "")),
        labels=tuple(k for k in AGENT_LABELS if k in labels),
        capacity=tuple(k for k in AGENT_RESOURCES if k in capacity),
        allocatable=tuple(k for k in AGENT_RESOURCES if k in allocatable),
    )


def ours_slice(resource_slice: Obj) -> bool:
    return (resource_slice.get("spec") or {}).get("driver") == dra.DRIVER


def ours_device_class(device_class: Obj) -> bool:
    return (_meta(device_class).get("labels") or {}).get(PART_OF) == "topoalloc"


def pod_gates(pod: Obj) -> list[str]:
    return [
        str(g.get("name"))
        for g in (pod.get("spec") or {}).get("schedulingGates") or []
        if isinstance(g, Mapping) and g.get("name") is not None
    ]


def gate_release(pod: Obj) -> list[JSON]:
    """The JSON patch removing topoalloc's gates from `pod` (others stay), tested at the pod's uid
    and at each gate's index as read; [] when it has none of them."""
    gates = pod_gates(pod)
    ours = [i for i, g in enumerate(gates) if g in GATES]
    if not ours:
        return []
    ops: list[JSON] = [{"op": "test", "path": "/metadata/uid", "value": _meta(pod).get("uid")}]
    if len(ours) == len(gates):
        value = [{"name": g} for g in gates]
        return [
            *ops,
            {"op": "test", "path": "/spec/schedulingGates", "value": value},
            {"op": "remove", "path": "/spec/schedulingGates"},
        ]
    for index in reversed(ours):  # from the end, so the earlier indexes still hold
        path = f"/spec/schedulingGates/{index}"
        ops += [{"op": "test", "path": f"{path}/name", "value": gates[index]}, {"op": "remove", "path": path}]
    return ops


def released_gates(pod: Obj) -> list[str]:
    return [g for g in pod_gates(pod) if g in GATES]


@dataclass(frozen=True)
class Leftovers:
    """What cleanup leaves on purpose (user state), to be said."""

    claims: tuple[str, ...] = ()  # ResourceClaims allocated from topoalloc's driver
    reservations: tuple[str, ...] = ()  # Reservations still holding (or about to hold) room
    pods: tuple[str, ...] = ()  # live pods whose devices topoalloc allocated

    def lines(self) -> list[str]:
        out = []
        if self.claims:
            out.append(
                f"left {len(self.claims)} ResourceClaim(s) allocated from {dra.DRIVER}'s devices (their "
                "pods keep the devices until they end; kube-scheduler allocates no new ones): "
                f"{some(self.claims)}"
            )
        if self.reservations:
            out.append(
                f"left {len(self.reservations)} Reservation(s) holding room (nothing releases them until "
                f"they expire or are deleted): {some(self.reservations)}"
            )
        if self.pods:
            out.append(
                f"left {len(self.pods)} pod(s) running with devices topoalloc allocated "
                f"({keys.DEVICE_ALLOCATED}; they keep them until they end): {some(self.pods)}"
            )
        return out


def leftovers(claims: Iterable[Obj], reservations: Iterable[Obj], pods: Iterable[Obj]) -> Leftovers:
    def allocated(claim: Obj) -> bool:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or []
        return any(r.get("driver") == dra.DRIVER for r in results)

    def holding(res: Obj) -> bool:
        return not _meta(res).get("deletionTimestamp") and (res.get("status") or {}).get("phase") in HELD

    def running(pod: Obj) -> bool:
        phase = (pod.get("status") or {}).get("phase")
        annotations = _meta(pod).get("annotations") or {}
        return keys.DEVICE_ALLOCATED in annotations and phase not in TERMINAL

    return Leftovers(
        claims=tuple(sorted(key(c) for c in claims if allocated(c))),
        reservations=tuple(sorted(key(r) for r in reservations if holding(r))),
        pods=tuple(sorted(key(p) for p in pods if running(p))),
    )


def some(names: Sequence[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (f" ... ({len(names) - limit} more)" if len(names) > limit else "")
