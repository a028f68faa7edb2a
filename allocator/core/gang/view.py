"""What the gang lifecycle step is shown of one gang: plain data the caller reads from its watch
cache, its hold ledger and the outcomes of the writes it carried out for the gang last time.

`Gang` is one gang as a pass sees it (members, PodGroup, size, timeout, what the ledger holds for
its members, the generation of the member index); `MemberPod` a member's few facts; `Clocks` the
two clocks' values at the step; `Outcomes` what became of the gang's asynchronous actions
(evictions, gate removals, status writes) since its last step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from allocator.core.gang.levels import Levels
from apis import keys
from apis.gang_object import GangObject
from apis.podgroup import GangRef
from apis.resources import TERMINAL_POD_PHASES


@dataclass(frozen=True)
class MemberPod:
    key: str
    namespace: str
    name: str
    uid: str
    gang: GangRef | None
    gang_error: str  # a gang annotation that does not decode (the webhook refuses such pods)
    job_group: str
    node: str
    phase: str
    deleting: bool
    created: str  # creationTimestamp, RFC 3339
    gates: tuple[str, ...]
    scheduler: str
    annotations: Mapping[str, str]
    priority: int = 0  # spec.priority (the PriorityClass value)

    @property
    def active(self) -> bool:
        return self.phase not in TERMINAL_POD_PHASES and not self.deleting

    @property
    def gated(self) -> bool:
        return keys.GANG_SCHEDULING_GATE in self.gates

    @property
    def other_gates(self) -> tuple[str, ...]:
        """Gates the gang waits for: neither its own nor placement's (placement places a member on
        its gang's plan once the gang's gate is gone)."""
        return tuple(g for g in self.gates if g not in (keys.GANG_SCHEDULING_GATE, keys.PLACEMENT_GATE))

    @property
    def gang_key(self) -> str:
        return self.gang.key if self.gang is not None else ""

    @property
    def job_key(self) -> tuple[str, str] | None:
        return (self.namespace, self.job_group) if self.job_group else None


@dataclass(frozen=True)
class Outcomes:
    """What became of the gang's asynchronous actions since its last step (the caller collects
    them as the writes finish; the step folds them into the gang's state)."""

    evictions: Mapping[str, str] = field(default_factory=dict)  # victim key -> "" done, else why refused
    gates_refused: frozenset[str] = frozenset()  # member keys whose gate removal the API refused
    status_refused: bool = False  # the PodGroup status write was refused: write it again


@dataclass
class Gang:
    """One gang as a pass sees it."""

    key: str
    namespace: str
    name: str
    source: str  # apis.podgroup's *_SOURCE
    # The object that defines it, read (a PodGroup of either API, a Workload's pod group); None
    # for a Koordinator gang, or while the object is missing or invalid (`problem` says which).
    api_object: GangObject | None
    problem: str  # why it cannot be planned at all (its PodGroup is missing or invalid)
    min_member: int
    timeout: float  # seconds, 0 for none
    members: list[MemberPod]  # oldest first
    holds: Mapping[str, str] = field(default_factory=dict)  # member key -> uid the hold ledger holds it for
    generation: int = 0  # changes whenever the watch reported anything (a fruitless attempt retries then)
    outcomes: Outcomes = field(default_factory=Outcomes)
    # The topology levels its members keep to (levels.py), None for none; `problem_code` is the
    # Waiting reason of `problem` (InvalidTopology for a wish that does not decode).
    levels: Levels | None = None
    problem_code: str = "InvalidPodGroup"

    @property
    def active(self) -> list[MemberPod]:
        return [m for m in self.members if m.active]

    @property
    def keeps_status(self) -> bool:
        """Its object has a status topoalloc writes (not a Workload's pod group, not Koordinator's)."""
        return self.api_object is not None and self.api_object.has_status


@dataclass(frozen=True)
class Clocks:
    """The clocks' values at a step: `mono` measures intervals (bind and preemption timeouts),
    `wall` is the time of day (gang timeouts, scheduleStartTime, starvation)."""

    mono: float
    wall: float
