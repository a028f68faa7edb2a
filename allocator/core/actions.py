"""The action vocabulary every lifecycle of the core speaks (gangs, DRA claims, Reservations,
defragmentation, placement): what a pure `step` decides, as plain data a thin adapter carries out
with one `match` (allocator/<component>/controller.py).

Each name means one thing across the lifecycles:

  Event           an Event on an object (a pod, a PodGroup, a Reservation, a ResourceClaim)
  Ungate          remove one scheduling gate from a pending pod
  Nudge           touch a pending pod so kube-scheduler looks at it again now (its unschedulable
                  queue waits minutes otherwise); `node`: the node planned for it, if any
  Evict           evict a running pod through the Eviction API (budgets honoured)
  WriteStatus     merge a status onto an object (a PodGroup of either API, a Reservation)
  Annotate        merge annotations onto an object (None removes one)
  Count, Observe  a counter increment, a histogram or gauge observation (the component's metrics
                  name them)
  Requeue         look at a key again in `after` seconds (a deadline, a timeout); `after` 0: at once
  Retry           look at a key again after its backoff pause (a refused or failed step)
  Forget          the key went through: its next retry starts from the shortest pause

What a lifecycle needs beyond these is its own and named for itself (a gang's `TellMembers`, the
claims' `WriteAllocation`, defragmentation's `CreateReservation`): "Hold" is the hold ledger's
alone (a device hold: allocator/runtime/ledger.py), "Reservation" is Koordinator's object alone.
Actions that change the hold ledger are applied at once, through the lifecycle's planner, never
returned: later decisions of the same pass must see them.

`owner` on an asynchronous action (Ungate, Evict, WriteStatus, Annotate) names the key whose next
step is told what became of it (the lifecycle's `Outcomes`), "" for none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]


@dataclass(frozen=True)
class ObjectRef:
    """The object an action is about: a pod by default, else any namespaced or cluster object."""

    namespace: str
    name: str
    uid: str = ""
    kind: str = "Pod"
    api_version: str = "v1"

    @property
    def is_pod(self) -> bool:
        return self.kind == "Pod" and self.api_version == "v1"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True)
class Event:
    target: ObjectRef
    type: str  # Normal or Warning
    reason: str
    note: str
    action: str = "Scheduling"


@dataclass(frozen=True)
class Ungate:
    pod: ObjectRef
    gate: str
    owner: str = ""


@dataclass(frozen=True)
class Nudge:
    pod: ObjectRef
    node: str = ""
    owner: str = ""


@dataclass(frozen=True)
class Evict:
    pod: ObjectRef  # its uid is the eviction's precondition: never a re-created pod of the name
    node: str = ""
    owner: str = ""


@dataclass(frozen=True)
class WriteStatus:
    target: ObjectRef
    status: JSON
    owner: str = ""


@dataclass(frozen=True)
class Annotate:
    target: ObjectRef
    annotations: Mapping[str, str | None] = field(default_factory=dict)
    owner: str = ""


@dataclass(frozen=True)
class Count:
    metric: str
    label: str = ""
    by: float = 1


@dataclass(frozen=True)
class Observe:
    metric: str
    value: float
    label: str = ""


@dataclass(frozen=True)
class Requeue:
    key: str
    after: float = 0.0


@dataclass(frozen=True)
class Retry:
    key: str


@dataclass(frozen=True)
class Forget:
    key: str


Shared = Event | Ungate | Nudge | Evict | WriteStatus | Annotate | Count | Observe | Requeue | Retry | Forget
