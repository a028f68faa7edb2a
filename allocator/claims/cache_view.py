"""What the claims controller and the DRA admission gate read and do with the watch cache.

The pending pods (their whole objects), the Nodes' facts (taints, cordons), the PodGroups (a gang
of claims waits for its minMember), the parsed DRA objects
with each DRA node's published devices, and the hold ledger's claim holds. The runtime's
`ClusterCache` is the one implementation in the process, handed in by allocator/assembly.py
(tests/runtime/test_cache_views.py checks it fits); tests/claims/fakes.py has an in-memory one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from allocator.core.claims.published import NodeDevices
from allocator.runtime.cache.dra import ClaimEntry
from allocator.runtime.cache.records import Hold, NodeFacts, PodEntry
from allocator.runtime.coreadapter import PodRequest
from apis.annotations import DeviceAllocations
from apis.dra_claims import DeviceClass, ResourceClaimTemplate

JSON = dict[str, Any]


@runtime_checkable
class DraView(Protocol):
    @property
    def claims(self) -> Mapping[str, ClaimEntry]: ...

    @property
    def templates(self) -> Mapping[str, ResourceClaimTemplate | str]: ...

    @property
    def classes(self) -> Mapping[str, DeviceClass | str]: ...

    @property
    def published(self) -> Mapping[str, NodeDevices]: ...


@runtime_checkable
class ClaimsLedger(Protocol):
    """Claim holds in the hold ledger (allocator/runtime/ledger.py)."""

    @property
    def holds(self) -> Mapping[str, Hold]: ...

    def hold_claim(
        self, key: str, uid: str, node: str, allocations: DeviceAllocations, req: PodRequest, holder: str
    ) -> Hold | str: ...

    def drop_hold(self, key: str, *, force: bool = False) -> bool: ...


@runtime_checkable
class ClaimsCache(Protocol):
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
    def dra(self) -> DraView: ...

    @property
    def ledger(self) -> ClaimsLedger: ...
