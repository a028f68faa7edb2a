"""What the Reservation lifecycle's step sees of one pass: the Reservations it looks at (each as
the book and the watch cache hold it), the gangs they belong to, the topology profile, and the
nodes where room was freed since the last pass. Plain data, built by the controller
(allocator/reservations/controller.py) from the book and the watch cache; tests build it by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from allocator.core.actions import ObjectRef
from allocator.core.request.pod_request import PodRequest
from allocator.core.reservation.status import OwnerPod
from apis import reservation as rv
from apis.annotations import DeviceAllocations
from apis.topology_profile import TopologyProfile


@dataclass(frozen=True)
class Victim:
    """A pod evicted to make a room, still holding its devices."""

    key: str
    uid: str
    node: str
    deleting: bool = False  # already on its way out: not evicted again


@dataclass(frozen=True)
class HeldRoom:
    """The room held for a Reservation now (placed here, or read back from the API)."""

    node: str
    reserved: DeviceAllocations
    placed_here: bool = False  # held by this process, not yet Available in the API
    victims: tuple[str, ...] = ()  # the pods evicted for it; it is written once they are gone
    left: tuple[Victim, ...] = ()  # those of `victims` still holding their devices
    held_since: float = 0.0
    annotations: Mapping[str, str] = field(default_factory=dict)  # written beside its devices


@dataclass(frozen=True)
class Seen:
    """One Reservation as the step sees it."""

    name: str
    uid: str
    res: rv.Reservation | None  # None: it does not decode (`error` says why)
    error: str = ""
    status: Mapping[str, Any] = field(default_factory=dict)  # the object's status as read
    req: PodRequest | None = None  # the template's request
    class_priority: int | None = None  # its template's PriorityClass value, read from the API
    room: HeldRoom | None = None
    node_exists: bool = True  # the room's node is still in the cluster
    bound: tuple[str, ...] = ()  # its owners bound now (pod keys, sorted)
    owners: tuple[OwnerPod, ...] = ()  # those of `bound` the cache holds, as the status counts them
    said: str = ""  # the condition note last written for it (not written again)

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef("", self.name, self.uid, rv.KIND, rv.API_VERSION)

    @property
    def created(self) -> float:
        return self.res.created if self.res is not None and self.res.created is not None else 0.0

    def request(self) -> PodRequest:
        """The template's request, at its PriorityClass's priority when it names one."""
        assert self.req is not None
        if self.class_priority is None:
            return self.req
        return replace(self.req, priority=self.class_priority)

    @property
    def may_preempt(self) -> bool:
        """Its template carries a priority and does not say preemptionPolicy Never."""
        spec = (self.res.template.get("spec") if self.res is not None else None) or {}
        has_priority = spec.get("priority") is not None or self.class_priority is not None
        return has_priority and spec.get("preemptionPolicy") != "Never"


@dataclass(frozen=True)
class GangSeen:
    """A gang of Reservations: where its members holding room are (node -> how many)."""

    holding: Mapping[str, int] = field(default_factory=dict)

    @property
    def held(self) -> int:
        return sum(self.holding.values())


@dataclass(frozen=True)
class WaitingPod:
    """A pending pod kube-scheduler found unschedulable and now holds back (its unschedulable queue
    waits up to five minutes before it tries again unasked)."""

    ref: ObjectRef
    priority: int = 0
    created: float = 0.0

    @property
    def order(self) -> tuple[int, float, str]:
        """kube-scheduler's queue order: higher priority first, then older."""
        return (-self.priority, self.created, self.ref.key)


@dataclass(frozen=True)
class PassView:
    reservations: tuple[Seen, ...] = ()
    gangs: Mapping[str, GangSeen] = field(default_factory=dict)
    profile: TopologyProfile | None = None  # None: gangs of Reservations keep to no level
    freed: frozenset[str] = frozenset()  # nodes where room was given back since the last pass
