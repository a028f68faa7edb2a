"""What the gang lifecycle remembers of a gang between steps (lost on restart by design: a new
leader plans afresh, or continues a hold recorded on the members, hold_record.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from allocator.core.gang.victims import Candidate

JSON = dict[str, Any]


@dataclass(frozen=True)
class Planned:
    uid: str
    node: str
    devices: int = 0  # devices its hold takes (the held-devices gauge of preempting gangs)


@dataclass
class Preempting:
    """A gang's preemption (or starvation hold) in progress."""

    victims: dict[str, Candidate]  # pod key -> the victim as planned
    since: float  # monotonic clock
    blocked: dict[str, str] = field(default_factory=dict)  # pod key -> why its eviction was refused
    evicted: set[str] = field(default_factory=set)  # accepted: the pod is on its way out
    evict: bool = True  # False: a starvation hold, waiting for the pods to finish on their own

    def due(self, left: list[Candidate]) -> list[Candidate]:
        """Victims to evict now: those whose eviction was not accepted yet."""
        return [v for v in left if v.key not in self.evicted]

    def copy(self) -> Preempting:
        return replace(self, blocked=dict(self.blocked), evicted=set(self.evicted))


# A wait that is really a preemption or a starvation hold is the same news as its start Event.
_SAME_AS = {"Preempting": "GangPreempting", "HoldingRoom": "GangHoldingRoom"}


@dataclass(frozen=True)
class Decision:
    """The gang's latest reported decision (told to PodGroup gangs' members once per kind)."""

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
    """What the lifecycle remembers of a gang between steps."""

    plan: dict[str, Planned] = field(default_factory=dict)
    planned_at: float = 0.0  # monotonic clock
    start: float | None = None  # wall clock: when the gang had its minimum of members
    reason: str = ""  # why the gang waits ("" when it does not)
    wait_code: str = ""  # the reason's kind, the Waiting condition's reason (InsufficientTopology...)
    reported: str = ""  # the last note written as Events
    attempt: tuple[object, ...] | None = None  # what the last fruitless planning attempt saw
    done: bool | None = None  # minMember bound (None: not looked at yet)
    failed_reported: bool = False
    status: JSON | None = None  # the PodGroup status last written
    nudged: dict[str, str] = field(default_factory=dict)  # pod key -> planned node annotated
    ungating: dict[str, str] = field(default_factory=dict)  # pod key -> uid whose gate removal was sent
    told: set[str] = field(default_factory=set)  # late members told why they wait
    preempting: Preempting | None = None  # victims being evicted for the plan (gates kept)
    record: str = ""  # id of the hold recorded on the members (hold_record.py)
    decision: Decision | None = None  # the latest decision reported (PodGroup gangs)
    # pod key -> (uid, decision kind) a member was told (by the caller, which rate-limits those Events)
    members_told: dict[str, tuple[str, str]] = field(default_factory=dict)

    def copy(self) -> GangState:
        """An independent copy (the step never changes the state it is given)."""
        return replace(
            self,
            plan=dict(self.plan),
            nudged=dict(self.nudged),
            ungating=dict(self.ungating),
            told=set(self.told),
            preempting=self.preempting.copy() if self.preempting is not None else None,
            members_told=dict(self.members_told),
        )
