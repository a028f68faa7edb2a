"""The migration lifecycle: what the migration controller does next, decided from what the API
shows (pure; allocator/defrag carries the actions out).

A move is carried out as: a Reservation for the pod's replacement on the target
(`CreateReservation`), then, once it is Available, the pod evicted through the Eviction API (the
shared `Evict`, its `owner` the Reservation), then the replacement, recreated by the pod's
controller, takes the room (allocateOnce: the Reservation Succeeds). The move is finished when that
replacement is bound on the room's node and Ready, or when the room has expired (its Reservation
Failed, or past the time its TTL gave it). The state of every move in flight is its Reservation
(labelled and annotated by the controller), so a restarted leader reads it back and neither loses
a move nor makes one twice: a pod with a Reservation of its own is never planned again, and a
finished one counts until the window has passed (`CloseReservation` then closes it: marked, and
expired so any room left goes back; the allocator deletes no object).

Limits, like Koordinator's MigrationController's: at most `max_migrating` moves in flight in the
cluster, `per_namespace` in one namespace, `per_workload` of one workload's pods (its controller),
and `per_window` moves started in any `window` seconds. A workload's own limits (`caps`: its
maxUnavailable, a budget's allowed disruptions) count its moves in flight too, and a
maxUnavailable also counts the workload's pods unavailable now (not Ready, pending, terminating)
that no move accounts for, so a move never takes more of a workload down at once than it allows.
A Reservation not Available within `reserve_timeout` (or that failed) is given up; its pod is
never evicted. A move the limits hold back is said (an `Event`, `DefragHeld`, and a count); a dry
run plans and says each move (`DefragPlanned`) but reserves and evicts nothing.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from allocator.core.actions import Count, Event, Evict, ObjectRef
from allocator.core.defrag.plan import DefragPlan, Move

DEFRAGMENT = "Defragment"  # the Events' action
HELD = "DefragHeld"
PLANNED = "DefragPlanned"
MOVES = "moves"  # the counter of moves' steps (allocator/defrag/metrics.py)


@dataclass(frozen=True)
class Limits:
    max_migrating: int = 2
    per_namespace: int = 2
    per_workload: int = 1
    per_window: int = 10
    window: float = 3600.0
    reserve_timeout: float = 300.0


@dataclass(frozen=True)
class Migration:
    """One move as its Reservation tells it."""

    reservation: str  # the Reservation's name
    pod: str  # namespace/name of the pod moved
    uid: str  # the pod's uid
    workload: str
    source: str
    target: str
    phase: str  # the Reservation's status.phase ("" before it has one)
    created: float
    evicted: bool  # the controller evicted the pod (an annotation on the Reservation)
    pod_present: bool  # the pod with that uid still exists
    closed: bool = False  # the controller finished it (its room given back by expiry)
    ready: bool = False  # the replacement that took the room is bound on its node and Ready
    expires: float = math.inf  # when the room expires (its TTL): the move is over by then

    @property
    def namespace(self) -> str:
        return self.pod.partition("/")[0]

    def finished(self, now: float) -> bool:
        """Nothing left to do: its replacement runs Ready on the room, or the room failed or
        expired."""
        done = self.phase == "Succeeded" and self.ready
        return self.closed or done or self.phase == "Failed" or now >= self.expires


@dataclass(frozen=True)
class WorkloadCap:
    """A limit a workload sets itself on its pods down at once."""

    limit: int
    source: str  # who says so: "Deployment maxUnavailable", "PodDisruptionBudget disruptionsAllowed"
    # Its pods unavailable now that no move in flight accounts for: they count against a
    # maxUnavailable (a budget's allowed disruptions has counted them already).
    unavailable: int = 0


@dataclass(frozen=True)
class CreateReservation:
    move: Move


@dataclass(frozen=True)
class CloseReservation:
    migration: Migration
    reason: str  # "Done", "Expired", "TimedOut", "Failed", "PodGone"


Action = CreateReservation | CloseReservation | Evict | Event | Count


def pod_ref(key: str, uid: str) -> ObjectRef:
    namespace, _, name = key.partition("/")
    return ObjectRef(namespace, name, uid)


def held_note(move: Move, why: str) -> str:
    return f"move to {move.target} held back: {why}"


def held_why(note: str) -> str:
    """What holds a move back, from its `DefragHeld` note."""
    return note.partition(" held back: ")[2]


def step(
    migrations: Sequence[Migration],
    plan: DefragPlan,
    limits: Limits,
    now: float,
    *,
    dry_run: bool,
    caps: Mapping[str, Sequence[WorkloadCap]] | None = None,
) -> list[Action]:
    """The actions for this pass, in order: finished or stuck moves first, then evictions of pods
    whose room is ready, then new moves within the limits. `caps`: per workload, the limits it
    sets itself."""
    caps = caps or {}
    out: list[Action] = []
    active: list[Migration] = []
    for m in migrations:
        if m.finished(now):
            if not m.closed and now - m.created >= limits.window:
                out.append(CloseReservation(m, _why_over(m)))
            continue
        if not m.pod_present and not m.evicted and m.phase in ("", "Pending"):
            # It went on its own before its room was placed: the room is not needed. (Once the
            # room is Available, the pod's replacement takes it whoever evicted the pod.)
            out.append(CloseReservation(m, "PodGone"))
            continue
        if m.phase == "Available" and not m.evicted:
            out.append(Evict(pod_ref(m.pod, m.uid), m.source, owner=m.reservation))
        elif m.phase in ("", "Pending") and now - m.created >= limits.reserve_timeout:
            out.append(CloseReservation(m, "TimedOut"))
            continue
        active.append(m)
    recent = sum(1 for m in migrations if now - m.created < limits.window)
    migrating = {m.pod for m in migrations}
    in_ns = Counter(m.namespace for m in active)
    in_workload = Counter(m.workload for m in active if m.workload)
    count = len(active)
    for move in plan.moves:
        if move.key in migrating:
            continue
        namespace = move.key.partition("/")[0]
        why = ""
        if count >= limits.max_migrating:
            why = f"{count} moves in flight (maxMigrating {limits.max_migrating})"
        elif in_ns[namespace] >= limits.per_namespace:
            why = f"{in_ns[namespace]} moves in flight in {namespace} (perNamespace {limits.per_namespace})"
        elif move.workload:
            why = _workload_why(
                move.workload, in_workload[move.workload], limits, caps.get(move.workload, ())
            )
        if not why and recent >= limits.per_window:
            why = f"{recent} moves started in the last {limits.window:g}s (perWindow {limits.per_window})"
        target = pod_ref(move.key, move.uid)
        if dry_run:
            out.append(
                Event(
                    target,
                    "Normal",
                    PLANNED,
                    f"dry run: would move to {move.target} for {move.unblocks}",
                    DEFRAGMENT,
                )
            )
            out.append(Count(MOVES, "planned"))
            continue
        if why:
            out.append(Event(target, "Normal", HELD, held_note(move, why), DEFRAGMENT))
            out.append(Count(MOVES, "held"))
            continue
        out.append(CreateReservation(move))
        count += 1
        recent += 1
        in_ns[namespace] += 1
        if move.workload:
            in_workload[move.workload] += 1
    return out


def _workload_why(workload: str, moving: int, limits: Limits, caps: Sequence[WorkloadCap]) -> str:
    """Why one more of the workload's pods may not move now ("" when it may): its moves in flight
    against `per_workload`, then against each limit of its own with its pods down that no move
    accounts for."""
    if moving >= limits.per_workload:
        return f"{moving} of {workload} moving (perWorkload {limits.per_workload})"
    for cap in sorted(caps, key=lambda c: (c.limit - c.unavailable, c.source)):
        if moving + cap.unavailable >= cap.limit:
            down = f", {cap.unavailable} unavailable" if cap.unavailable else ""
            return f"{moving} of {workload} moving{down} ({cap.source} {cap.limit})"
    return ""


def _why_over(m: Migration) -> str:
    if m.phase == "Failed":
        return "Failed"
    return "Done" if m.phase == "Succeeded" and m.ready else "Expired"
