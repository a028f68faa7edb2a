"""What gang scheduling reads and does with the watch cache, and nothing more.

The controller reads the members' pod entries, the Nodes' facts (taints, cordon) and the objects
that define gangs (scheduler-plugins PodGroups, native PodGroups, Workloads), and holds (or
drops) its plans' devices in the hold ledger. The runtime's
`ClusterCache` is the one implementation in the process, handed in by allocator/assembly.py
(tests/runtime/test_cache_views.py checks it fits); tests/gang/fakes.py has an in-memory one for
unit tests of the steering.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from allocator.runtime.cache.budgets import DisruptionBudgets
from allocator.runtime.cache.dra import ClaimEntry
from allocator.runtime.cache.records import Hold, NodeFacts, PodEntry
from allocator.runtime.coreadapter import PodRequest
from apis.annotations import DeviceAllocations

JSON = dict[str, Any]


@runtime_checkable
class GangLedger(Protocol):
    """Gang plans' part of the hold ledger (allocator/runtime/ledger.py)."""

    @property
    def holds(self) -> Mapping[str, Hold]: ...

    def hold(
        self, key: str, uid: str, node: str, allocations: DeviceAllocations, req: PodRequest, holder: str
    ) -> Hold | str: ...

    def drop_hold(self, key: str, *, force: bool = False) -> bool: ...


@runtime_checkable
class PodClaims(Protocol):
    """The ResourceClaims: a member whose claims are allocated is held to their node."""

    @property
    def claims(self) -> Mapping[str, ClaimEntry]: ...


@runtime_checkable
class GangCache(Protocol):
    @property
    def pods(self) -> Mapping[str, PodEntry]: ...

    @property
    def nodes(self) -> Mapping[str, NodeFacts]: ...

    @property
    def podgroups(self) -> Mapping[str, JSON]: ...

    @property
    def native_podgroups(self) -> Mapping[str, JSON]: ...

    @property
    def workloads(self) -> Mapping[str, JSON]: ...

    @property
    def ledger(self) -> GangLedger: ...

    @property
    def budgets(self) -> DisruptionBudgets: ...

    @property
    def dra(self) -> PodClaims: ...
