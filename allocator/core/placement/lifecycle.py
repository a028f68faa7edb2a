"""The placement lifecycle: one pure step per pass deciding what becomes of the pending GPU pods
placement looks after; the caller acts (allocator/placement/controller.py).

    PlacementLifecycle(door, settings).step(view, now) -> actions

Placement mode places every pod that asks for a device resource topoalloc manages, whatever its
scheduler: the admission webhook gates it (`topoalloc.io/placement`), this step chooses its node and
devices with the same core and steering as the extender (a gang member goes to its gang's plan, a
room's owner to its room), the door holds them in the hold ledger at once, and the caller writes
them on the pod (`WritePlacement`: the recorded allocation, the node kube-scheduler is to bind it
to, the gate removed); kube-scheduler binds at its own speed. Per pod, highest priority first, then
oldest:

1. Gated by placement alone (other gates, a gang's or anyone's, are waited for): placed and written
   (`WritePlacement`); or, when it fits nowhere, an Event and a condition say why, kube-scheduler's
   way, and it is tried again after its backoff pause (`Retry`; at once when it or the cluster
   changes); or, when evicting lower-priority pods makes room (device- and gang-aware victims,
   PodDisruptionBudgets weighed), those are evicted (`Evict`) and it is looked at again shortly.
2. Placed (its recorded allocation names a node) but not held here (another leader placed it, this
   process restarted): its recorded devices are held again (`door.restore`), or, when they are not
   free any more, it is placed anew without a gate to remove.
3. Placed, then refused by kube-scheduler (PodScheduled False/Unschedulable with its fit error after
   the placement: a filter topoalloc does not model; its gang plugin waiting for the rest of a pod
   group refuses no node): a pod pinned by node affinity (which cannot change once the
   gate is gone) is evicted so its controller creates it anew (`Replace`; the new pod is placed
   with the refused nodes left out); a pod pinned by nomination is placed anew with the refused nodes
   left out, once per new reason, and with no node left its recorded allocation is cleared
   (`ClearPlacement`), so wherever kube-scheduler binds it the node's agent chooses its devices.
4. A write that failed comes back (`Outcome`): the hold goes, an Event says why, it is retried.
5. A pod whose scheduler does not run (`binds_here`: the second scheduler of an earlier install in
   secondary mode): placed as in 1 and bound by topoalloc itself (`BindPlacement`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from allocator.core.actions import Count, Event, Evict, Forget, ObjectRef, Requeue, Retry, WriteStatus
from allocator.core.placement.view import PendingPod, PlacementView
from apis import keys

ACTION = "Placing"  # the Events' action
CONDITION = keys.TOPOALLOC + "Placed"  # the pod condition that says why a gated pod waits


@dataclass(frozen=True)
class Placed:
    node: str
    annotations: dict[str, str]  # what the pod records: device-allocated, the node it is for, ...


@dataclass(frozen=True)
class NoRoom:
    why: str  # kube-scheduler's way: "0/12 nodes can host the pod's devices: 8 ..."
    victims: tuple[tuple[ObjectRef, str], ...] = ()  # (pod, node) whose eviction makes room


class PlacementDoor(Protocol):
    """The core's decisions and the hold ledger, for one pending pod at a time."""

    def place(self, key: str, refused: frozenset[str]) -> Placed | NoRoom:
        """Choose the pod's node (not one of `refused`) and devices, and hold them at once."""
        ...

    def restore(self, key: str) -> bool:
        """Hold again the devices the pod records (placed by another leader); False when they
        are not free any more (or the record does not decode)."""
        ...

    def held(self, key: str) -> bool:
        """Whether the hold ledger holds the pod's devices for it."""
        ...

    def release(self, key: str) -> None: ...


@dataclass(frozen=True)
class PlacementLifecycleSettings:
    preemption: bool = True
    # After evicting victims, look again this soon (they may take a while to go).
    preemption_recheck: float = 1.0
    # A controller's pod that kube-scheduler refused: its next pods keep off the refused nodes for
    # this long (the controller creates them anew under other names).
    refused_memory: float = 600.0


# -- placement's own actions (the shared ones: allocator/core/actions.py) ------------------------


@dataclass(frozen=True)
class WritePlacement:
    """Record the placement on the pod (annotations) and pin it to `node` for kube-scheduler; with
    `ungate`, remove the placement gate in the same write. Its answer comes back as the pod's
    `Outcome`."""

    pod: ObjectRef
    node: str
    annotations: dict[str, str]
    ungate: bool = True


@dataclass(frozen=True)
class BindPlacement:
    """Bind the pod to `node` with its recorded allocation in the same write (no scheduler of its
    runs to bind it)."""

    pod: ObjectRef
    node: str
    annotations: dict[str, str]


@dataclass(frozen=True)
class Replace:
    """Evict a pod pinned to a node kube-scheduler refuses (its node affinity cannot change), so its
    controller creates it anew and the new pod is placed elsewhere."""

    pod: ObjectRef
    why: str


@dataclass(frozen=True)
class ClearPlacement:
    """Remove the pod's recorded allocation (no node left that kube-scheduler accepts)."""

    pod: ObjectRef


Action = WritePlacement | ClearPlacement | Event | Evict | WriteStatus | Count | Requeue | Retry | Forget


@dataclass
class _Memory:
    """What the step keeps between passes, per pod key."""

    written: dict[str, str] = field(default_factory=dict)  # key -> uid: placement written, gate not seen gone
    refused: dict[str, set[str]] = field(default_factory=dict)  # key -> nodes kube-scheduler refused
    seen_refusal: dict[str, str] = field(default_factory=dict)  # key -> the refusal last acted on
    said: dict[str, str] = field(default_factory=dict)  # key -> the last reason told (Event, condition)
    evicting: set[str] = field(default_factory=set)  # victims whose eviction was asked
    # controller uid -> (nodes kube-scheduler refused its pods, until when that is remembered)
    by_controller: dict[str, tuple[set[str], float]] = field(default_factory=dict)


class PlacementLifecycle:
    def __init__(self, door: PlacementDoor, settings: PlacementLifecycleSettings | None = None) -> None:
        self.door = door
        self.settings = settings or PlacementLifecycleSettings()
        self.memory = _Memory()
        self.now = 0.0

    def step(self, view: PlacementView, now: float) -> list[Action]:
        out: list[Action] = []
        self.now = now
        if view.full:
            present = {p.key for p in view.pods}
            self.forget([k for k in self.memory.said.keys() | self.memory.written.keys() if k not in present])
        for pod in queue_order(view.pods):
            outcome = view.outcomes.get(pod.key)
            if outcome is not None and outcome.refused:
                out += self._write_refused(pod, outcome.refused)
            elif keys.PLACEMENT_GATE in pod.gates or (pod.binds_here and not pod.placed_on):
                out += self._gated(pod)
            elif pod.placed_on:
                out += self._placed(pod)
        return out

    # -- 1. gated ------------------------------------------------------------------------------------

    def _gated(self, pod: PendingPod) -> list[Action]:
        mem = self.memory
        if mem.written.get(pod.key) == pod.ref.uid:
            return []  # written: the watch has not shown the gate gone yet
        if any(g != keys.PLACEMENT_GATE for g in pod.gates):
            return []  # another gate holds it (a gang's plan, a queue): placed once it is the last
        got = self.door.place(pod.key, self._refused_for(pod))
        if isinstance(got, Placed):
            mem.written[pod.key] = pod.ref.uid
            mem.said.pop(pod.key, None)
            write: Action = (
                BindPlacement(pod.ref, got.node, got.annotations)
                if pod.binds_here
                else WritePlacement(pod.ref, got.node, got.annotations)
            )
            return [
                write,
                Forget(pod.key),
                Count("placements", "placed"),
            ]
        if got.victims and self.settings.preemption:
            return self._preempt(pod, got)
        return [*self._tell(pod, "Unplaceable", got.why), Retry(pod.key), Count("placements", "unplaceable")]

    def _preempt(self, pod: PendingPod, got: NoRoom) -> list[Action]:
        out: list[Action] = []
        new = [(v, node) for v, node in got.victims if v.key not in self.memory.evicting]
        for victim, node in new:
            self.memory.evicting.add(victim.key)
            out.append(Evict(victim, node, owner=pod.key))
        if new:
            names = ", ".join(v.key for v, _ in new[:5]) + (
                f" and {len(new) - 5} more" if len(new) > 5 else ""
            )
            note = f"evicting {len(new)} lower-priority pod(s) to make room: {names}"
            out.append(Event(pod.ref, "Normal", "Preempting", note, ACTION))
            out.append(Count("placements", "preempting"))
        out.append(Requeue(pod.key, self.settings.preemption_recheck))
        return out

    # -- 2., 3. placed -------------------------------------------------------------------------------

    def _placed(self, pod: PendingPod) -> list[Action]:
        mem = self.memory
        mem.written.pop(pod.key, None)  # the gate is gone: the write landed
        refusal = refused_nodes(pod.unschedulable) and f"{pod.unschedulable_since} {pod.unschedulable}"
        if refusal and mem.seen_refusal.get(pod.key) != refusal:
            mem.seen_refusal[pod.key] = refusal
            refused = mem.refused.setdefault(pod.key, set())
            refused.add(pod.placed_on)
            if pod.pinned:
                return self._replace(pod)
            return self._again(pod, frozenset(refused), f"kube-scheduler refused {pod.placed_on}")
        if not self.door.held(pod.key) and not self.door.restore(pod.key):
            return self._again(pod, frozenset(mem.refused.get(pod.key, ())), "its devices were taken")
        return []

    def _again(self, pod: PendingPod, refused: frozenset[str], why: str) -> list[Action]:
        """Placed anew (no gate left to remove), or its recorded allocation cleared."""
        self.door.release(pod.key)
        got = self.door.place(pod.key, refused)
        if isinstance(got, Placed):
            note = f"{why} ({pod.unschedulable or 'placed before'}): placed on {got.node} instead"
            return [
                WritePlacement(pod.ref, got.node, got.annotations, ungate=False),
                Event(pod.ref, "Warning", "Replaced", note, ACTION),
                Count("placements", "replaced"),
            ]
        note = f"{why}; no other node can host its devices ({got.why}): the node it binds to chooses them"
        return [ClearPlacement(pod.ref), Event(pod.ref, "Warning", "PlacementCleared", note, ACTION)]

    def _replace(self, pod: PendingPod) -> list[Action]:
        why = f"kube-scheduler refused {pod.placed_on} ({pod.unschedulable})"
        if not pod.controller:
            # A pod of no controller pinned by affinity: nobody creates it anew; say so.
            return self._tell(pod, "Refused", f"{why}; the pod has no controller to create it anew")
        nodes, _ = self.memory.by_controller.get(pod.controller, (set(), 0.0))
        nodes.add(pod.placed_on)
        self.memory.by_controller[pod.controller] = (nodes, self.now + self.settings.refused_memory)
        self.door.release(pod.key)
        note = f"{why}: evicted so its controller creates it anew, placed elsewhere"
        return [Replace(pod.ref, why), Event(pod.ref, "Warning", "Replacing", note, ACTION),
                Count("placements", "replaced")]  # fmt: skip

    def _refused_for(self, pod: PendingPod) -> frozenset[str]:
        got = self.memory.by_controller.get(pod.controller) if pod.controller else None
        if got is None:
            return frozenset()
        nodes, until = got
        if until <= self.now:
            del self.memory.by_controller[pod.controller]
            return frozenset()
        return frozenset(nodes)

    # -- 4. refused writes ---------------------------------------------------------------------------

    def _write_refused(self, pod: PendingPod, why: str) -> list[Action]:
        self.memory.written.pop(pod.key, None)
        self.door.release(pod.key)
        return [*self._tell(pod, "PlacementNotWritten", f"writing the placement: {why}"), Retry(pod.key)]

    # -- telling -------------------------------------------------------------------------------------

    def _tell(self, pod: PendingPod, reason: str, why: str) -> list[Action]:
        """An Event and the pod's condition, once per distinct reason (kube-scheduler repeats its
        own; an Event per retry would flood `kubectl describe`)."""
        if self.memory.said.get(pod.key) == why:
            return []
        self.memory.said[pod.key] = why
        condition = {"type": CONDITION, "status": "False", "reason": reason, "message": why}
        return [
            Event(pod.ref, "Warning", "FailedPlacement", why, ACTION),
            WriteStatus(pod.ref, {"conditions": [condition]}, owner=pod.key),
        ]

    def forget(self, keys_: Sequence[str]) -> None:
        """These pods left placement's care (bound, deleted): nothing of them is kept."""
        mem = self.memory
        for key in keys_:
            for table in (mem.written, mem.refused, mem.seen_refusal, mem.said):
                table.pop(key, None)

    def victims_gone(self, keys_: Sequence[str]) -> None:
        """The caller saw these victims go: they may be named again (a re-created pod)."""
        self.memory.evicting.difference_update(keys_)


def refused_nodes(message: str) -> bool:
    """Whether kube-scheduler's Unschedulable message is its verdict on the nodes (its fit error,
    `0/12 nodes are available: ...`), so the node the pod was placed on refused it. Other messages
    hold the pod for no node's reason: kube-scheduler's gang plugin waiting for the rest of the pod
    group (`pod group is unschedulable, waiting for minCount pods ...`), which the gang's plan settles."""
    return _FIT_ERROR.match(message) is not None


_FIT_ERROR = re.compile(r"0/\d+ nodes are available")


def queue_order(pods: Sequence[PendingPod]) -> list[PendingPod]:
    """Highest priority first, then oldest, then by name: kube-scheduler's own queue order."""
    return sorted(pods, key=lambda p: (-p.priority, p.created, p.key))
