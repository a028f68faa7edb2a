"""What the claims lifecycle (lifecycle.py) is shown each pass: the pending pods that name
ResourceClaims with their claims sorted by what topoalloc does with each, what became of the writes
made for them since, and, in a full pass, every claim (for the release of unused ones).

The allocator builds it from its watch cache (allocator/claims/pod_claims.py); tests build it by
hand. Plain data: pods are their API objects, claims the parsed `ResourceClaim`s.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocator.core.actions import ObjectRef
from apis.dra_claims import ResourceClaim

JSON = dict[str, Any]


@dataclass
class PodClaims:
    """A pod's claims as the cache has them."""

    waiting: str = ""  # why not every claim exists yet ("" once they all do)
    refused: str = ""  # why topoalloc will never allocate them as written
    todo: list[ResourceClaim] = field(default_factory=list)  # topoalloc's, not allocated yet
    allocated: list[ResourceClaim] = field(default_factory=list)  # topoalloc.io's, allocated by anyone
    left: list[str] = field(default_factory=list)  # claims left to kube-scheduler, and why
    pinned: str = ""  # the node the allocated claims require ("" none)
    # Allocated claims of topoalloc's some device of which another allocated claim also holds
    # (what the cache shows; the pod is not ungated while one is here: race.py).
    contested: list[ResourceClaim] = field(default_factory=list)
    rivals: dict[str, tuple[str, ...]] = field(default_factory=dict)  # claim key -> the other claims

    @property
    def ready(self) -> bool:
        return not self.waiting and not self.refused


@dataclass(frozen=True)
class Member:
    """A pod whose claims `todo` are to be allocated together (alone, or with its gang)."""

    key: str
    pod: JSON
    todo: list[ResourceClaim]
    pinned: str = ""  # the node claims already allocated require ("" none)


@dataclass(frozen=True)
class Outcome:
    """What the API answered to the writes made for a pod since its last step."""

    ungated: bool = False  # its gate is gone (the watch may not show it yet)
    failed: str | None = None  # writing its claims failed: why
    gate_refused: bool = False  # removing its gate was refused (the pod changed, or is gone)
    # Its claims' allocation was written: claim key -> the resourceVersion the write returned (the
    # pod is ungated once the cache shows each claim at that version or later).
    written: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PendingPod:
    key: str
    uid: str
    pod: JSON  # the object as the cache has it (its request and tolerations are read from it)
    gated: bool  # it carries topoalloc.io/dra
    unschedulable: str | None  # kube-scheduler's message when it found no node for it (None: not so)
    claims: PodClaims
    gang: str = ""  # the gang it belongs to ("" none)
    gang_size: int = 0  # how many members with claims to allocate the gang waits for
    outcome: Outcome | None = None

    @property
    def ref(self) -> ObjectRef:
        meta = self.pod.get("metadata") or {}
        return ObjectRef(meta.get("namespace") or "default", meta.get("name") or "", self.uid)


@dataclass(frozen=True)
class ClaimsView:
    """One pass: `pods` in key order (those gated, refused by kube-scheduler, or with an outcome;
    the others are on their way to a node). A full pass also shows every decoded claim, which of
    them pending pods name, and which the hold ledger holds (keys `claim:<namespace>/<name>`)."""

    pods: Sequence[PendingPod]
    full: bool = False
    claims: Sequence[ResourceClaim] = ()
    referenced: Container[str] = frozenset()
    held: Container[str] = frozenset()
