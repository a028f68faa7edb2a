"""What the gang controller knows of a gang: its state kept between passes, and one pass's view."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from allocator.core.gang.victims import Candidate
from allocator.gang.cache_view import GangCache
from allocator.gang.index import MemberPod
from allocator.runtime.events import PodRef
from apis import podgroup as pg

JSON = dict[str, Any]


@dataclass(frozen=True)
class Planned:
    uid: str
    node: str


@dataclass
class Preempting:
    """A gang's preemption in progress (kept in its GangState)."""

    victims: dict[str, Candidate]  # pod key -> the victim as planned
    since: float  # controller clock
    blocked: dict[str, str] = field(default_factory=dict)  # pod key -> why its eviction was refused
    evicting: set[str] = field(default_factory=set)  # evictions in flight
    evicted: set[str] = field(default_factory=set)  # accepted: the pod is on its way out
    evict: bool = True  # False: a starvation hold, waiting for the pods to finish on their own

    def due(self, left: list[Candidate]) -> list[Candidate]:
        """Victims to evict now: not accepted yet and not in flight."""
        return [v for v in left if v.key not in self.evicted and v.key not in self.evicting]

    def left(self, cache: GangCache) -> list[Candidate]:
        """Victims still holding their devices (the same pod, bound and active in the cache)."""
        out = []
        for key, victim in self.victims.items():
            entry = cache.pods.get(key)
            if entry is not None and entry.uid == victim.uid and entry.holds:
                out.append(victim)
        return out


# A wait that is really a preemption or a starvation hold is the same news as its start Event.
_SAME_AS = {"Preempting": "GangPreempting", "HoldingRoom": "GangHoldingRoom"}


@dataclass(frozen=True)
class Decision:
    """The gang's latest reported decision (kept in GangState; told to members by member_events.py)."""

    reason: str  # the Event reason: GangWaiting, GangPlanned, GangScheduled, ...
    code: str  # GangWaiting's kind (the Waiting condition's reason), else ""
    type: str
    note: str

    @property
    def kind(self) -> str:
        """What a member must be told again only when it changes."""
        if self.reason != "GangWaiting":
            return self.reason
        return _SAME_AS.get(self.code, f"GangWaiting/{self.code}")

    def member_note(self, gang_key: str) -> str:
        lead = f"gang {gang_key}"
        return (
            f"{lead} waits ({self.code}): {self.note}"
            if self.reason == "GangWaiting"
            else f"{lead}: {self.note}"
        )


@dataclass
class GangState:
    """What the controller remembers of a gang between passes (lost on restart by design)."""

    plan: dict[str, Planned] = field(default_factory=dict)
    planned_at: float = 0.0
    start: float | None = None  # wall clock: when the gang had its minimum of members
    reason: str = ""  # why the gang waits ("" when it does not)
    wait_code: str = ""  # the reason's kind, the Waiting condition's reason (InsufficientTopology...)
    reported: str = ""  # the last note written as Events
    attempt: tuple[object, ...] | None = None  # what the last fruitless planning attempt saw
    done: bool | None = None  # minMember bound (None: not looked at yet)
    failed_reported: bool = False
    status: JSON | None = None  # the PodGroup status last written
    nudged: dict[str, str] = field(default_factory=dict)  # pod key -> planned node annotated
    told: set[str] = field(default_factory=set)  # late members told why they wait
    preempting: Preempting | None = None  # victims being evicted for the plan (gates kept)
    record: str = ""  # id of the hold recorded on the members (gang/hold_record.py)
    decision: Decision | None = None  # the latest decision reported (PodGroup gangs; member_events.py)
    members_told: dict[str, tuple[str, str]] = field(default_factory=dict)  # pod key -> (uid, kind)


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
