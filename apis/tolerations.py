"""Whether tolerations tolerate a taint (corev1's ToleratesTaint) and whether a pod is let onto a
node at all (TaintToleration, NodeUnschedulable): for gang planning, placing Reservations and
Reservation taints alike."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

JSON = dict[str, Any]


def tolerates(tolerations: Iterable[JSON], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        if not isinstance(t, dict):
            continue
        effect = t.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = t.get("key") or ""
        if (t.get("operator") or "Equal") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


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
