"""The migration lifecycle: what the migration controller does next, decided from what the API
shows (pure; allocator/defrag carries the actions out).

A move is carried out as: a Reservation for the pod's replacement on the target (`Reserve`), then,
once it is Available, the pod evicted through the Eviction API (`Evict`), then the replacement,
recreated by the pod's controller, consumes the room (allocateOnce: the Reservation Succeeds). The
state of every move in flight is its Reservation (labelled and annotated by the controller), so a
restarted leader reads it back and neither loses a move nor makes one twice: a pod with a
Reservation of its own is never planned again, and a finished one counts until the window has
passed (`Finish` then closes it: marked, and expired so any room left goes back; the allocator
deletes no object).

Limits, like Koordinator's MigrationController's: at most `max_migrating` moves in flight in the
cluster, `per_namespace` in one namespace, `per_workload` of one workload's pods (its
controller; lower where the workload's own `caps` say so: its maxUnavailable, a budget's allowed
disruptions), and `per_window` moves started in any `window` seconds. A Reservation not Available
within `reserve_timeout` (or that failed) is given up; its pod is never evicted. A dry run plans
and reports (`Report`) but reserves and evicts nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from allocator.core.defrag.plan import DefragPlan, Move


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

    @property
    def namespace(self) -> str:
        return self.pod.partition("/")[0]

    @property
    def finished(self) -> bool:
        """Nothing left to do: the room was consumed, failed, or the pod went and was evicted."""
        return self.closed or self.phase in ("Succeeded", "Failed") or (self.evicted and not self.pod_present)


@dataclass(frozen=True)
class Reserve:
    move: Move


@dataclass(frozen=True)
class Evict:
    migration: Migration


@dataclass(frozen=True)
class Finish:
    migration: Migration
    reason: str  # "Done", "Expired", "TimedOut", "Failed", "PodGone"


@dataclass(frozen=True)
class Hold:
    """A planned move the limits hold back this time (told on the pod)."""

    move: Move
    why: str


@dataclass(frozen=True)
class Report:
    """A dry run's planned move (an Event on the pod and a line of the report)."""

    move: Move


Action = Reserve | Evict | Finish | Hold | Report


def step(
    migrations: Sequence[Migration],
    plan: DefragPlan,
    limits: Limits,
    now: float,
    *,
    dry_run: bool,
    caps: Mapping[str, tuple[int, str]] | None = None,
) -> list[Action]:
    """The actions for this pass, in order: finished or stuck moves first, then evictions of pods
    whose room is ready, then new moves within the limits. `caps`: per workload, the most of its
    pods it lets move at once and who says so (below `per_workload` only)."""
    caps = caps or {}
    out: list[Action] = []
    active: list[Migration] = []
    for m in migrations:
        if m.finished:
            if not m.closed and now - m.created >= limits.window:
                out.append(Finish(m, "Failed" if m.phase == "Failed" else "Done"))
            continue
        if not m.pod_present and not m.evicted and m.phase in ("", "Pending"):
            # It went on its own before its room was placed: the room is not needed. (Once the
            # room is Available, the pod's replacement takes it whoever evicted the pod.)
            out.append(Finish(m, "PodGone"))
            continue
        if m.phase == "Available" and not m.evicted:
            out.append(Evict(m))
        elif m.phase in ("", "Pending") and now - m.created >= limits.reserve_timeout:
            out.append(Finish(m, "TimedOut"))
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
        elif move.workload and in_workload[move.workload] >= _cap(limits, caps, move.workload)[0]:
            cap, source = _cap(limits, caps, move.workload)
            why = f"{in_workload[move.workload]} of {move.workload} moving ({source} {cap})"
        elif recent >= limits.per_window:
            why = f"{recent} moves started in the last {limits.window:g}s (perWindow {limits.per_window})"
        if dry_run:
            out.append(Report(move))
            continue
        if why:
            out.append(Hold(move, why))
            continue
        out.append(Reserve(move))
        count += 1
        recent += 1
        in_ns[namespace] += 1
        if move.workload:
            in_workload[move.workload] += 1
    return out


def _cap(limits: Limits, caps: Mapping[str, tuple[int, str]], workload: str) -> tuple[int, str]:
    own = caps.get(workload)
    if own is not None and own[0] < limits.per_workload:
        return own
    return limits.per_workload, "perWorkload"
