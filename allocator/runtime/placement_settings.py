"""Settings of placement mode (the `placement:` block of the allocator's config): every pod asking
for a device resource topoalloc manages is placed at admission, whatever its scheduler
(docs/placement.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from apis import resources as rn

# The device resources of Koordinator's protocol and the whole-GPU names kubelet's device plugins
# serve: a pod asking for any of them is placement's.
MANAGED_RESOURCES = tuple(rn.RESOURCE_DEVICE_TYPE)
PINS = ("auto", "affinity", "nominate")  # placement.pin (the chart's schema reads it too)


@dataclass
class PlacementSettings:
    enabled: bool = False
    # How a placed pod is pinned to its node (allocator/placement/writes.py, docs/placement.md):
    # `auto` (a required node affinity term for a pod that has a controller, one write; the node
    # nominated for a pod that has none, two writes, never stuck), `affinity` or `nominate`.
    pin: str = "auto"
    resources: list[str] = field(default_factory=lambda: list(MANAGED_RESOURCES))
    # Namespaces whose pods are never gated (the webhook configuration's namespaceSelector skips
    # them too; topoalloc's own namespace is always left alone).
    excluded_namespaces: list[str] = field(default_factory=lambda: ["kube-system"])
    # Only pods for these schedulers are gated; empty means every pod, whatever its scheduler.
    scheduler_names: list[str] = field(default_factory=list)
    # Pods for these schedulers are placed and bound by topoalloc itself, not gated: no such
    # scheduler runs in placement mode (the second scheduler of an install in secondary mode, whose
    # pods keep their schedulerName through an upgrade).
    bind_for: list[str] = field(default_factory=lambda: ["topoalloc-scheduler"])
    # On the leader, place a pod that has a controller (pinned by node affinity) while its creation
    # is admitted: created pinned, its devices recorded, no gate (allocator/placement/admit.py).
    decide_at_admission: bool = True
    # How long devices chosen at admission stay held for a pod that has not shown up in the watch.
    # It shows up within a second of our answer, unless its creation was refused after it (a later
    # webhook, a quota, validation): then the hold keeps its devices from everyone until this
    # passes. Generous, because a hold let go before its pod shows up could give those devices to
    # another pod (a slow watch on a loaded API server); a minute is far beyond any watch delay.
    admission_hold_ttl: float = 60.0
    # A pod that fits nowhere evicts the cheapest lower-priority pods that make room (Eviction API,
    # so PodDisruptionBudgets hold).
    preemption: bool = True
    # Seconds between full passes when nothing wakes the controller, the pause that batches a burst
    # of admissions into one pass, the writes in flight at once, and the retry pauses of a pod that
    # fits nowhere (doubling from `retry_initial` to `retry_max`; at once when it or the cluster
    # changes).
    resync_period: float = 5.0
    batch_delay: float = 0.01
    concurrency: int = 64
    retry_initial: float = 1.0
    retry_max: float = 60.0

    def __post_init__(self) -> None:
        if self.pin not in PINS:
            raise ValueError(f"placement.pin: expected auto, affinity or nominate, got {self.pin!r}")
        if not self.admission_hold_ttl > 0:
            raise ValueError(
                f"placement.admissionHoldTtl: expected seconds > 0, got {self.admission_hold_ttl!r}"
            )
