"""What the extender reads and does with the watch cache, and nothing more.

The binder reads a pending pod and reserves its devices in the hold ledger (or rolls the
reservation back); the preempt verb lists the running pods it may name as victims. The runtime's
`ClusterCache` is the one implementation in the process (tests/runtime/test_cache_views.py checks
it fits); tests/extender/fakes.py has an in-memory one for unit tests of the binder.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from allocator.runtime.cache.budgets import DisruptionBudgets
from allocator.runtime.cache.records import Hold, PodEntry
from allocator.runtime.coreadapter import PodRequest, Rejection

JSON = dict[str, Any]


@runtime_checkable
class BindLedger(Protocol):
    """The bind path's part of the hold ledger (allocator/runtime/ledger.py)."""

    @property
    def holds(self) -> Mapping[str, Hold]: ...

    def reserve(self, pod: JSON, req: PodRequest, node: str, *, holder: str = "") -> Hold | Rejection: ...

    def release(self, res: Hold) -> bool: ...


@runtime_checkable
class ExtenderCache(Protocol):
    @property
    def pods(self) -> Mapping[str, PodEntry]: ...

    @property
    def ledger(self) -> BindLedger: ...

    @property
    def budgets(self) -> DisruptionBudgets: ...

    def pod(self, namespace: str, name: str) -> PodEntry | None: ...
