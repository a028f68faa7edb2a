"""What the gang lifecycle step decides, as plain data the caller carries out (allocator/gang).

Two actions change the hold ledger, and the plans made later in the same pass must see them: the
step hands `Reserve` and `Release` to its planner (`Planner.reserve`, `Planner.release`), which
applies them at once; `reserve` answers whether every hold was made (all of them, or none: a
refused hold undoes the ones before it), and the step goes on from that answer. Every other action
is returned, in the order decided, and applied after the step:

  Report       an Event on the gang's PodGroup or on a member pod
  TellMembers  the gang's latest decision told to its members (rate-limited by the caller)
  Ungate       remove the gang's scheduling gate from a planned member
  Nudge        annotate a released member with its planned node (kube-scheduler retries it)
  Evict        evict a victim through the Eviction API
  WriteStatus  merge the status of the gang's object (a PodGroup of either API)
  RecordHold   record a held room on a member (hold_record.py); ClearHold removes the record
  Count, Duration, PassGauges   metric observations
  WakeAt       the latest wall-clock time the next pass must run by (a timeout or bind deadline)

Evictions, gate removals and status writes answer later: the caller reports what became of them
in the gang's next view (`Outcomes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from allocator.core.gang.gang_state import GangState
from allocator.core.gang.hold_record import HoldRecord
from allocator.core.gang.victims import Candidate
from allocator.core.gang.view import Gang, MemberPod
from apis.annotations import DeviceAllocations

JSON = dict[str, Any]


# -- the hold ledger, applied at once through the planner ----------------------------------------


@dataclass(frozen=True)
class Hold:
    key: str
    uid: str
    node: str
    devices: DeviceAllocations


@dataclass(frozen=True)
class Reserve:
    """Hold every placement of a plan for the gang, or none."""

    gang: str
    holds: tuple[Hold, ...]


@dataclass(frozen=True)
class Release:
    """Drop the members' holds (`force`: even while a bind of one is under way)."""

    keys: tuple[str, ...]
    force: bool = False


# -- returned, applied after the step --------------------------------------------------------------


@dataclass(frozen=True)
class EventTarget:
    """The object an Event (or a status write) is about: a member pod, or the gang's own object
    (a PodGroup of either API, a Workload)."""

    namespace: str
    name: str
    uid: str = ""
    kind: str = "Pod"
    api_version: str = "v1"

    @property
    def is_pod(self) -> bool:
        return self.kind == "Pod" and self.api_version == "v1"

    @classmethod
    def of_object(cls, gang: Gang) -> EventTarget:
        """The gang's object (it must have one)."""
        obj = gang.api_object
        assert obj is not None
        return cls(obj.namespace, obj.name, obj.uid, obj.kind, obj.api_version)


@dataclass(frozen=True)
class Report:
    """An Event (action "Scheduling")."""

    target: EventTarget
    type: str  # Normal or Warning
    reason: str
    note: str


@dataclass(frozen=True)
class TellMembers:
    """Tell the gang's members its latest decision (`state.decision`), each once per kind; the
    caller records who heard it in `state.members_told`."""

    gang: Gang
    state: GangState


@dataclass(frozen=True)
class Ungate:
    gang: str
    member: MemberPod


@dataclass(frozen=True)
class Nudge:
    member: MemberPod
    node: str


@dataclass(frozen=True)
class Evict:
    gang: str
    victim: Candidate


@dataclass(frozen=True)
class WriteStatus:
    """The gang's status, in scheduler-plugins' terms (podgroup_status.py), onto its object; the
    caller writes it in the object's own shape (a native PodGroup keeps conditions only)."""

    gang: str
    target: EventTarget
    status: JSON


@dataclass(frozen=True)
class RecordHold:
    member: MemberPod
    record: HoldRecord


@dataclass(frozen=True)
class ClearHold:
    key: str
    uid: str


# Counters of gang scheduling (allocator/gang/metrics.py names them).
Counter = Literal["plans", "timeouts", "preemptions", "victims"]


@dataclass(frozen=True)
class Count:
    metric: Counter
    label: str = ""
    by: int = 1


@dataclass(frozen=True)
class Duration:
    """A gang got its minimum of members bound this long after it first had them."""

    seconds: float


@dataclass(frozen=True)
class PassGauges:
    """What one pass saw over every gang."""

    waiting_pods: int  # members held back because their gang has no placement yet
    waiting_reasons: tuple[str, ...]  # the Waiting reason of every waiting gang
    held_devices: int  # devices held for gangs that preempt or hold room


@dataclass(frozen=True)
class WakeAt:
    wall: float


Action = (
    Report
    | TellMembers
    | Ungate
    | Nudge
    | Evict
    | WriteStatus
    | RecordHold
    | ClearHold
    | Count
    | Duration
    | PassGauges
    | WakeAt
)
