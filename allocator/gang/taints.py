"""Which nodes kube-scheduler would let a pod onto at all: taints and cordons (the TaintToleration
and NodeUnschedulable plugins). The planner checks devices, cpu, memory, pod slots and node
affinity itself; without this a plan could name a node kube-scheduler then refuses, and the member
would wait for `bindTimeout` before its gang is planned again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apis.tolerations import tolerates

__all__ = ["admits", "tolerates", "tolerations_of"]

JSON = dict[str, Any]
UNSCHEDULABLE = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
BLOCKING = ("NoSchedule", "NoExecute")


def admits(node_spec: Mapping[str, Any], tolerations: list[JSON]) -> bool:
    """False when a NoSchedule/NoExecute taint (or a cordon) of the node is not tolerated."""
    if node_spec.get("unschedulable") and not tolerates(tolerations, UNSCHEDULABLE):
        return False
    return all(
        tolerates(tolerations, taint)
        for taint in node_spec.get("taints") or []
        if isinstance(taint, dict) and taint.get("effect") in BLOCKING
    )


def tolerations_of(pod: Mapping[str, Any]) -> list[JSON]:
    spec = pod.get("spec") or {}
    found = spec.get("tolerations") if isinstance(spec, dict) else None
    return [t for t in found or [] if isinstance(t, dict)]
