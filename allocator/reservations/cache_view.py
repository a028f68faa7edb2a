"""What Reservations read and do with the watch cache, and nothing more.

The book reads the Reservations, the pods (an owner's allocations), the Nodes (labels for
reservation affinity, taints for placing) and the PodDisruptionBudgets preemption weighs, and holds
each room in the hold ledger; the placer is the ledger's, set at wiring time. The runtime's
`ClusterCache` is the one implementation in the process (tests/runtime/test_cache_views.py checks
it fits).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from allocator.runtime.cache.budgets import DisruptionBudgets
from allocator.runtime.cache.records import Hold, NodeFacts, PodEntry
from allocator.runtime.coreadapter import PodRequest
from allocator.runtime.ledger import Placer
from apis.annotations import DeviceAllocations

JSON = dict[str, Any]


@runtime_checkable
class RoomLedger(Protocol):
    """Rooms' part of the hold ledger (allocator/runtime/ledger.py)."""

    placer: Placer
    on_drop: list[Callable[[Hold], None]]
    on_move: list[Callable[[str, Hold], None]]

    @property
    def holds(self) -> Mapping[str, Hold]: ...

    def hold_room(self, key: str, node: str, allocations: DeviceAllocations, req: PodRequest) -> None: ...

    def drop_room(self, key: str) -> bool: ...


@runtime_checkable
class ReservationCache(Protocol):
    @property
    def pods(self) -> Mapping[str, PodEntry]: ...

    @property
    def nodes(self) -> Mapping[str, NodeFacts]: ...

    @property
    def reservations(self) -> Mapping[str, JSON]: ...

    @property
    def ledger(self) -> RoomLedger: ...

    @property
    def budgets(self) -> DisruptionBudgets: ...
