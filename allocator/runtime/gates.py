"""Removing one scheduling gate from a pod: the write that hands a gated pod (a gang member, a pod
whose DRA claims topoalloc allocates) to kube-scheduler.

The JSON patch tests the pod's uid, so it never lands on a pod deleted and created again under the
same name, and tests the gate where it was read: the pod's only gate (then the whole list goes, as
kube-apiserver drops an empty one anyway), or the gate at its index among several, so a gate someone
else removed meanwhile (the list shifted) makes the patch fail instead of removing another gate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from allocator.runtime.kube import JSON_PATCH, KubeApi
from apis.kinds import PODS

JSON = dict[str, Any]


class GatedPod(Protocol):
    """What a gate's removal reads of the pod (the gang's MemberPod is one)."""

    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def gates(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class PodGates:
    """A pod's identity and its scheduling gates (names, in the pod's order)."""

    namespace: str
    name: str
    uid: str
    gates: tuple[str, ...]


def gate_removal(pod: GatedPod, gate: str) -> list[JSON]:
    """The JSON patch removing `gate` from `pod` (which must carry it), with its tests."""
    gates = list(pod.gates)
    index = gates.index(gate)
    ops: list[JSON] = [{"op": "test", "path": "/metadata/uid", "value": pod.uid}]
    if len(gates) == 1:
        return [
            *ops,
            {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": gate}]},
            {"op": "remove", "path": "/spec/schedulingGates"},
        ]
    return [
        *ops,
        {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": gate},
        {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
    ]


async def remove_gate(api: KubeApi, pod: GatedPod, gate: str) -> bool:
    """Remove `gate` from `pod` (this pod only: uid tested). False when the API refused it (logged);
    the caller's next pass sees the pod as it is then."""
    got = await api.patch(
        PODS.path(pod.name, namespace=pod.namespace),
        gate_removal(pod, gate),
        content_type=JSON_PATCH,
        what=f"removing the scheduling gate {gate} of {pod.namespace}/{pod.name}",
    )
    return bool(got)
