"""What the placement lifecycle (lifecycle.py) is shown each pass: the pending pods placement looks
after, and what became of the writes made for them since. Plain data: the allocator builds it from
its watch cache (allocator/placement/pass_view.py), tests build it by hand."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from allocator.core.actions import ObjectRef


@dataclass(frozen=True)
class PendingPod:
    ref: ObjectRef  # namespace, name, uid
    priority: int  # spec.priority
    created: str  # creationTimestamp, RFC 3339 (queue order among equal priorities)
    gates: tuple[str, ...]  # every scheduling gate it still has
    placed_on: str  # the node its recorded allocation was made for ("" none)
    unschedulable: str  # kube-scheduler's message while PodScheduled is False/Unschedulable
    unschedulable_since: str = ""  # that condition's lastTransitionTime
    controller: str = ""  # the uid of its controller (ownerReferences with controller: true)
    pinned: bool = False  # its placement is pinned by a required node affinity term (immutable)
    binds_here: bool = False  # its scheduler does not run: topoalloc binds it (`placement.bindFor`)

    @property
    def key(self) -> str:
        return self.ref.key


@dataclass(frozen=True)
class Outcome:
    """What the API answered to the writes made for a pod since its last step."""

    written: bool = False  # its placement is written (the watch may not show it yet)
    refused: str = ""  # writing it was refused: why


@dataclass(frozen=True)
class PlacementView:
    pods: Sequence[PendingPod]
    outcomes: Mapping[str, Outcome] = field(default_factory=dict)
    full: bool = False  # every pod placement looks after is here (a pod not here is gone)
