"""Removing one scheduling gate from a pod: the write that hands a gated pod (a gang member, a pod
whose DRA claims topoalloc allocates) to kube-scheduler.

Every removal names the pod's uid, so it never lands on a pod deleted and created again under the
same name. The pod's only gate goes with a merge patch setting the list to null: kube-apiserver lets
gates only be removed after a pod's creation, so the list holds ours at most, and it spends about a
fifth less CPU on that than on a JSON patch with tests (400 ungates, three rounds on v1.35.6:
1.9-2.7 ms against 2.5-3.4 ms a write). One gate of several goes by a JSON patch testing it at its
index, so a gate someone else removed meanwhile (the list shifted) makes the patch fail instead of
removing another gate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from allocator.runtime.kube import JSON_PATCH, MERGE_PATCH, KubeApi
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
    """Remove `gate` from `pod` (this pod only: its uid named). False when the API refused it
    (logged); the caller's next pass sees the pod as it is then."""
    only = tuple(pod.gates) == (gate,)
    body: Any = (
        {"metadata": {"uid": pod.uid}, "spec": {"schedulingGates": None}} if only else gate_removal(pod, gate)
    )
    got = await api.patch(
        PODS.path(pod.name, namespace=pod.namespace),
        body,
        content_type=MERGE_PATCH if only else JSON_PATCH,
        what=f"removing the scheduling gate {gate} of {pod.namespace}/{pod.name}",
    )
    return bool(got)
