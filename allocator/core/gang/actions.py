"""What the gang lifecycle step decides, as plain data the caller carries out (allocator/gang).

The step speaks the shared vocabulary (allocator/core/actions.py) where the meaning is the same:

  Event        an Event on the gang's object (a PodGroup of either API, a Workload) or a member
  Ungate       remove the gang's scheduling gate from a planned member (`owner`: the gang)
  Nudge        annotate a released member with its planned node (kube-scheduler retries it)
  Evict        evict a victim through the Eviction API (`owner`: the gang)
  WriteStatus  merge the status of the gang's object (`owner`: the gang)
  Count, Observe   metrics (allocator/gang/metrics.py names them)
  Requeue      the latest time the gang must be looked at again (a timeout or bind deadline)

and names the rest for itself:

  TellMembers  the gang's latest decision told to its members (rate-limited by the caller)
  RecordHold   record a held room on a member (hold_record.py); ClearHold removes the record

Two actions change the hold ledger, and the plans made later in the same pass must see them: the
step hands `HoldPlan` and `ReleaseHolds` to its planner (`Planner.hold`, `Planner.release`), which
applies them at once; `hold` answers whether every hold was made (all of them, or none: a refused
hold undoes the ones before it), and the step goes on from that answer. Every other action is
returned, in the order decided, and applied after the step. Evictions, gate removals and status
writes answer later: the caller reports what became of them in the gang's next view (`Outcomes`,
keyed by the action's `owner`).
"""

from __future__ import annotations

from dataclasses import dataclass

from allocator.core.actions import (
    Count,
    Event,
    Evict,
    Nudge,
    ObjectRef,
    Observe,
    Requeue,
    Ungate,
    WriteStatus,
)
from allocator.core.gang.gang_state import GangState
from allocator.core.gang.hold_record import HoldRecord
from allocator.core.gang.view import Gang, MemberPod
from apis.annotations import DeviceAllocations

# -- the hold ledger, applied at once through the planner ----------------------------------------


@dataclass(frozen=True)
class Hold:
    """One planned hold of the ledger: a member's devices on a node."""

    key: str
    uid: str
    node: str
    devices: DeviceAllocations


@dataclass(frozen=True)
class HoldPlan:
    """Hold every placement of a plan for the gang, or none."""

    gang: str
    holds: tuple[Hold, ...]


@dataclass(frozen=True)
class ReleaseHolds:
    """Drop the members' holds (`force`: even while a bind of one is under way)."""

    keys: tuple[str, ...]
    force: bool = False


# -- returned, applied after the step --------------------------------------------------------------


def object_ref(gang: Gang) -> ObjectRef:
    """The gang's object (it must have one): what its Events and status writes are about."""
    obj = gang.api_object
    assert obj is not None
    return ObjectRef(obj.namespace, obj.name, obj.uid, obj.kind, obj.api_version)


def member_ref(m: MemberPod) -> ObjectRef:
    return ObjectRef(m.namespace, m.name, m.uid)


@dataclass(frozen=True)
class TellMembers:
    """Tell the gang's members its latest decision (`state.decision`), each once per kind; the
    caller records who heard it in `state.members_told`."""

    gang: Gang
    state: GangState


@dataclass(frozen=True)
class RecordHold:
    member: MemberPod
    record: HoldRecord


@dataclass(frozen=True)
class ClearHold:
    key: str
    uid: str


# Counters of gang scheduling (allocator/gang/metrics.py names them): plans, timeouts,
# preemptions, victims. Observations: duration (a gang got its minimum of members bound this long
# after it first had them), and what one pass saw over every gang: waiting_pods (members held back
# because their gang has no placement yet), held_devices (held for gangs that preempt or hold
# room), waiting_gangs by the reason of their Waiting condition.
DURATION = "duration"
WAITING_PODS = "waiting_pods"
HELD_DEVICES = "held_devices"
WAITING_GANGS = "waiting_gangs"

Action = (
    Event
    | TellMembers
    | Ungate
    | Nudge
    | Evict
    | WriteStatus
    | RecordHold
    | ClearHold
    | Count
    | Observe
    | Requeue
)
