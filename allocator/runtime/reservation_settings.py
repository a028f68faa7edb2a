"""Settings of Reservations (the `reservations:` block of the allocator's config, docs/reservations.md)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ReservationSettings:
    enabled: bool = True
    # Seconds between full passes of the Reservation controller when nothing wakes it (expiry is
    # looked at no later than this either), and the pause that batches a burst of watch events.
    resync_period: float = 5.0
    batch_delay: float = 0.05
    # A Reservation whose template carries a priority (spec.priority, or a priorityClassName the
    # controller resolves) and no preemptionPolicy Never evicts the cheapest lower-priority pods that
    # make room for it (Eviction API, PodDisruptionBudgets hold; a gang of pods only whole); the
    # room is held meanwhile and given up when the victims are not gone within this many seconds.
    preemption: bool = True
    preemption_timeout: float = 300.0
    # Only Reservations whose template names one of these schedulers (spec.schedulerName, default
    # "default-scheduler") are placed here; empty places every one. Rooms placed by someone else
    # (Available, with their devices written) are honoured either way.
    scheduler_names: list[str] = field(default_factory=list)
