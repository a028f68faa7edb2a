"""Placement decided at admission (docs/placement.md, "Decided at admission"): on the leader, a pod
that has a controller is placed while the placement route answers its creation, so it is created
already pinned to its node (a required node affinity term), its devices recorded, and no gate:
kube-scheduler binds it at once, and the pod costs the API server its creation and its binding
alone, as on a cluster without topoalloc.

The decision is the controller's (`ClusterDoor.place_ahead`: the same nodes, devices and steering),
its devices held ahead in the hold ledger under a key of their own: the pod has no uid yet, and a
controller's pod often no name. The hold becomes the pod's when it shows up in the watch carrying
them, or goes after `admission_hold_ttl` (its creation was refused after our answer). Anything this
route cannot settle here and now is gated as before and left to the controller: no room (it needs
preemption or an explanation), a pod without a controller (pinned by nomination, which cannot be
written at creation), a gang member or a pod carrying another gate, a dry run (no side effects), a
standby or a leader still holding again what placed pods record. The request path makes no API
call: one decode of the pod, the core's columns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from allocator.placement.door import ClusterDoor
from allocator.placement.metrics import PlacementMetrics
from allocator.placement.writes import (
    AFFINITY,
    affinity_ops,
    annotation_ops,
    controller_of,
    in_pod_group,
    pin_of,
)
from allocator.runtime.placement_settings import PlacementSettings
from apis import keys

JSON = dict[str, Any]


class AdmissionPlacement:
    def __init__(
        self,
        door: ClusterDoor,
        settings: PlacementSettings,
        metrics: PlacementMetrics,
        *,
        admitting: Callable[[], bool],
        refused_by: Callable[[str], frozenset[str]],
    ) -> None:
        """`admitting`: whether this process may decide now (the controller's: leading, synced,
        every placed pod held); `refused_by`: the nodes a controller's pods keep off."""
        self.door = door
        self.settings = settings
        self.metrics = metrics
        self.admitting = admitting
        self.refused_by = refused_by

    def patch(self, request: JSON, pod: JSON, namespace: str) -> list[JSON] | None:
        """The JSON patch placing `pod` now (recorded allocation and node affinity, no gate), or
        None: gate it. Counted either way (`topoalloc_placement_admissions`)."""
        why = self._not_here(request, pod)
        if why:
            self.metrics.admissions.labels("gated", why).inc()
            return None
        meta = dict(pod.get("metadata") or {})
        meta["namespace"] = namespace  # the request carries it; the object often does not
        owner = controller_of(pod)
        placed = self.door.place_ahead(
            {**pod, "metadata": meta}, self.refused_by(owner), self.settings.admission_hold_ttl
        )
        if isinstance(placed, str):
            self.metrics.admissions.labels("gated", placed).inc()
            return None
        self.metrics.admissions.labels("decided", "").inc()
        return affinity_ops(pod, placed.node) + annotation_ops(pod, placed.annotations)

    def _not_here(self, request: JSON, pod: JSON) -> str:
        """Why the pod is not placed at admission ("" it is, if it fits)."""
        if not self.settings.decide_at_admission:
            return "off"
        if request.get("dryRun"):
            return "dry_run"  # no side effects on a dry run (sideEffects: NoneOnDryRun)
        if not controller_of(pod):
            return "no_controller"  # pinned by nomination, which cannot be written at creation
        if pin_of(pod, self.settings.pin) != AFFINITY:
            return "pin"  # placement.pin: nominate
        spec = pod.get("spec") or {}
        if spec.get("schedulingGates") or in_pod_group(pod):
            return "other_gate"  # a gang's, DRA's, a queue's: the controller waits for them
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if keys.ALLOCATED_NODE in annotations or keys.DEVICE_ALLOCATED in annotations:
            return "recorded"
        if not self.admitting():
            return "standby"
        return ""
