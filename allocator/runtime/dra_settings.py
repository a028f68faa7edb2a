"""Settings of DRA claim allocation (the `dra:` block of the allocator's config, docs/dra.md)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DraSettings:
    # Watch ResourceClaims, templates, DeviceClasses and ResourceSlices, gate pods whose claims use
    # topoalloc's DeviceClasses (the admission webhook, on the gang webhook's port) and allocate
    # their claims. Off: the extender still refuses DRA-mode nodes, nothing else changes.
    enabled: bool = True
    # Seconds between full passes when nothing wakes the controller, and the pause that batches a
    # burst of watch events into one pass.
    resync_period: float = 5.0
    batch_delay: float = 0.02
    # Pods whose claims are written at once (each: the claims' allocation, then the gate).
    concurrency: int = 64
    # A pod whose claims fit nowhere is tried again after this many seconds, doubling up to the
    # maximum (any change of the pod or its claims tries it at once).
    retry_initial: float = 1.0
    retry_max: float = 30.0
    # kube-scheduler could not place a pod on the node its claims were allocated on: they are
    # allocated elsewhere; again only when its reason changes or after this many seconds.
    reallocate_after: float = 20.0
    # A claim topoalloc allocated that no pod uses (not reserved, no pending pod names it) for this
    # many seconds is deallocated (kube-controller-manager does so only for kube-scheduler's).
    release_after: float = 30.0
    # Only pods for these schedulers are gated; empty means every pod.
    scheduler_names: list[str] = field(default_factory=list)
