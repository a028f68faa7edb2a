"""What placement reads and does with the watch cache: the pending pods (their whole objects), the
Nodes' facts (taints, cordons), the PodDisruptionBudgets preemption weighs, and the hold ledger (a
placed pod's devices held from its placement until the watch shows it bound). The runtime's
`ClusterCache` is the one implementation in the process (tests/runtime/test_cache_views.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from allocator.runtime.cache.budgets import DisruptionBudgets
from allocator.runtime.cache.records import Hold, NodeFacts, PodEntry
from allocator.runtime.coreadapter import PodRequest, Rejection
from apis.annotations import DeviceAllocations

JSON = dict[str, Any]


@runtime_checkable
class PlacementLedger(Protocol):
    @property
    def holds(self) -> Mapping[str, Hold]: ...

    def reserve(self, pod: JSON, req: PodRequest, node: str, *, holder: str = "") -> Hold | Rejection: ...

    def reserve_ahead(
        self, pod: JSON, req: PodRequest, node: str, *, holder: str, ttl: float
    ) -> Hold | Rejection: ...

    def hold(
        self, key: str, uid: str, node: str, allocations: DeviceAllocations, req: PodRequest, holder: str
    ) -> Hold | str: ...

    def release(self, res: Hold) -> bool: ...

    def drop_hold(self, key: str, *, force: bool = False) -> bool: ...


@runtime_checkable
class PlacementCache(Protocol):
    @property
    def pods(self) -> Mapping[str, PodEntry]: ...

    @property
    def nodes(self) -> Mapping[str, NodeFacts]: ...

    @property
    def budgets(self) -> DisruptionBudgets: ...

    @property
    def ledger(self) -> PlacementLedger: ...
