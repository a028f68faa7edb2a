"""What the migration controller reads from the watch cache, and nothing more (the runtime's
`ClusterCache` is the implementation in the process)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from allocator.runtime.cache.budgets import DisruptionBudgets
from allocator.runtime.cache.records import PodEntry

JSON = dict[str, Any]


@runtime_checkable
class DefragCache(Protocol):
    @property
    def pods(self) -> Mapping[str, PodEntry]: ...

    @property
    def reservations(self) -> Mapping[str, JSON]: ...

    @property
    def budgets(self) -> DisruptionBudgets: ...
