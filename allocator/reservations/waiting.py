"""The pods kube-scheduler holds as unschedulable, kept from the watch cache's pod events.

A pod it tried and could not place (`PodScheduled=False, reason Unschedulable`: the extender's
filter refused every node, for instance because a Reservation held the room) waits in its
unschedulable queue until a cluster event it watches may help, or five minutes pass. A Reservation
giving its room back is no such event (kube-scheduler does not watch Reservations), so the
Reservation controller offers freed room to these pods itself (allocator/core/reservation/
lifecycle.py). Pending, not deleting, not gated: a gated pod is not in that queue at all.
"""

from __future__ import annotations

import heapq
from typing import Any

from allocator.core.actions import ObjectRef
from allocator.core.reservation.view import WaitingPod
from apis.resources import TERMINAL_POD_PHASES
from apis.timestamps import parse_time

JSON = dict[str, Any]


class WaitingPods:
    def __init__(self) -> None:
        self.pods: dict[str, WaitingPod] = {}

    def observe(self, key: str, pod: JSON | None) -> None:
        if pod is None or not unschedulable(pod):
            self.pods.pop(key, None)
            return
        meta = pod.get("metadata") or {}
        priority = (pod.get("spec") or {}).get("priority")
        self.pods[key] = WaitingPod(
            ObjectRef(
                str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or "")
            ),
            priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
            parse_time(meta.get("creationTimestamp")) or 0.0,
        )

    def first(self, limit: int) -> list[WaitingPod]:
        """The first `limit` in kube-scheduler's queue order (higher priority, then older)."""
        return heapq.nsmallest(limit, self.pods.values(), key=lambda p: p.order)

    def __len__(self) -> int:
        return len(self.pods)


def unschedulable(pod: JSON) -> bool:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") or meta.get("deletionTimestamp") or spec.get("schedulingGates"):
        return False
    if status.get("phase") in TERMINAL_POD_PHASES:
        return False
    return any(
        isinstance(c, dict)
        and c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or ()
    )
