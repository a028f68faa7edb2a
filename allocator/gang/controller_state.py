"""What the gang controller knows of a gang: its state kept between passes, and one pass's view."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from allocator.gang.index import MemberPod
from allocator.service.events import PodRef
from apis import podgroup as pg

JSON = dict[str, Any]


@dataclass(frozen=True)
class Planned:
    uid: str
    node: str


@dataclass
class GangState:
    """What the controller remembers of a gang between passes (lost on restart by design)."""

    plan: dict[str, Planned] = field(default_factory=dict)
    planned_at: float = 0.0
    start: float | None = None  # wall clock: when the gang had its minimum of members
    reason: str = ""  # why the gang waits ("" when it does not)
    reported: str = ""  # the last note written as Events
    attempt: tuple[object, ...] | None = None  # what the last fruitless planning attempt saw
    done: bool | None = None  # minMember bound (None: not looked at yet)
    failed_reported: bool = False
    status: JSON | None = None  # the PodGroup status last written
    nudged: dict[str, str] = field(default_factory=dict)  # pod key -> planned node annotated
    told: set[str] = field(default_factory=set)  # late members told why they wait


@dataclass
class Gang:
    """One gang as a pass sees it."""

    key: str
    namespace: str
    name: str
    source: str
    podgroup: pg.PodGroup | None
    problem: str  # why it cannot be planned at all (its PodGroup is missing or invalid)
    min_member: int
    timeout: float  # seconds, 0 for none
    members: list[MemberPod]  # oldest first

    @property
    def active(self) -> list[MemberPod]:
        return [m for m in self.members if m.active]

    def ref(self) -> PodRef:
        return PodRef(self.namespace, self.name, "", pg.KIND, pg.API_VERSION)
