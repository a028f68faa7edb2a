"""The seam between the extender and Reservations (allocator/reservations).

As with gang scheduling (gang_hooks.py), imports run one way: `allocator.reservations` builds on the
runtime and implements `ReservationHooks` structurally, the extender never imports it, and
allocator/assembly.py plugs it in. The bind path needs no hook here: an owner's devices come from
its room through the hold ledger's placer (allocator/runtime/ledger.py), set at wiring time.
Without Reservations (`reservations.enabled: false`) the extender runs with no hooks at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from allocator.runtime.coreadapter import FilterVerdicts, PodRequest
from allocator.runtime.tasks import Spawn

JSON = dict[str, Any]


class ReservationHooks(Protocol):
    """What the extender asks of Reservations."""

    def steer_filter(self, pod: JSON, req: PodRequest, names: Sequence[str]) -> FilterVerdicts | None:
        """filter: the verdict for a pod that owns a room (its room's node), must land in one, or
        is kept off the cpu and memory rooms hold; None leaves the core's verdict alone."""
        ...

    def steer_scores(
        self, pod: JSON, req: PodRequest, names: Sequence[str], scores: np.ndarray
    ) -> np.ndarray | None:
        """prioritize: the core's scores with the owner's room node first; None keeps them."""
        ...

    def observe(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        """Every change the watch cache takes in."""
        ...

    def start(self, spawn: Spawn) -> None:
        """Spawn the background work (the controller that places Reservations)."""
        ...

    def stop(self) -> None:
        """The process stops or leadership is lost."""
        ...
