"""Departures, a queue and defragmentation: the gang-wait replay (simulator/gang_wait.py) in
simulated time, with the migration controller's planner and limits run on the simulated cluster.

Time: arrival i comes at i × `tick_seconds`; every placed pod or gang runs an exponential
lifetime (`lifetimes`: mean in hours, seeded), then leaves (a gang whole). What waits: gangs,
and lone whole-GPU pods of `queue_gpus` GPUs or more (large training pods); a smaller lone pod that
fits nowhere is dropped, as in the gang-wait replay. After every tick in which something left or
moved, the waiters are tried again in arrival order through the policy (no head-of-line blocking).

Priorities and owners, as a training cluster sets them: waiters (gangs, large pods) run at
`HIGH`, every other pod at `LOW` with a recreating owner (a ReplicaSet); gang members are in a
running gang, so the planner never moves them.

Defragmentation (`defrag=True`): every `interval` seconds, for the waiters that have waited
`min_wait` or more, the core's planner (`allocator.core.defrag.plan.plan_defrag`, the one the
controller calls) plans moves; the core's migration lifecycle (`migration.step`, the controller's
limits: moves in flight, per namespace, per workload, per window) decides which start. A move is
carried out as the controller does it: the replacement is placed on its target first (the room:
the core places it there now; a target no longer fit is given up and nothing moves), then the pod
leaves its old node. The simulator moves at once, so a move is never in flight across passes; the
window limit is what paces it. The moved pod's work is lost (its GPUs × its age, the planner's
own cost) and it restarts with its full duration: a checkpoint-less restart redoes everything.
The waiters are then tried again at once. Stops after the last arrival: what still waits counts
as never placed.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from allocator.core.actions import Count
from allocator.core.defrag.blocks import largest_block
from allocator.core.defrag.inputs import DefragPlanSettings, PodFacts, Waiter
from allocator.core.defrag.migration import CreateReservation, Limits, Migration, step
from allocator.core.defrag.plan import Move, plan_defrag
from allocator.core.gang.plan import GangPlan, plan_gang
from simulator.cluster import SimCluster, SimRequest
from simulator.engine import Arrival
from simulator.gang_planner import Gang
from simulator.policies import Policy

HIGH, LOW = 1000, 0
HOUR = 3600.0


@dataclass(frozen=True)
class DefragSimSettings:
    tick_seconds: float = 300.0  # simulated time between arrivals
    queue_gpus: int = 8  # lone whole-GPU pods this large wait in the queue
    defrag: bool = False
    interval: float = 1800.0  # planner cadence, seconds
    min_wait: float = 600.0  # a waiter is planned for once it has waited this long
    # Every simulated pod is in one namespace, so the namespace limit is the global one.
    limits: Limits = field(default_factory=lambda: Limits(max_migrating=4, per_namespace=4, per_window=16))
    planner: DefragPlanSettings = field(default_factory=DefragPlanSettings)
    sample_every: float = 3600.0  # largest free block sampled this often


@dataclass
class Unit:
    """A gang or a lone pod: placed, run and gone together."""

    name: str
    members: list[SimRequest]
    arrived: int  # tick
    lifetime: int  # ticks
    waits: bool  # a waiter (gang or large pod): HIGH priority
    gang: bool
    started: int = -1  # tick
    generation: int = 0  # bumped on a restart: older departures are void

    @property
    def gpus(self) -> int:
        return self.members[0].gpu_count


@dataclass
class DefragRun:
    """One run. Waits are in seconds; `waits` holds (wait, GPUs per member, members) of every
    waiter placed; `never` the (GPUs per member, members) of those still waiting at the end."""

    waits: list[tuple[float, int, int]] = field(default_factory=list)
    never: list[tuple[int, int]] = field(default_factory=list)
    blocks: list[tuple[float, int]] = field(default_factory=list)  # (hour, largest free block)
    moves: int = 0
    held: int = 0  # moves the limits held back (planned again next pass)
    given_up: int = 0  # moves whose target no longer fit when carried out
    gpu_hours_lost: float = 0.0
    passes: int = 0
    hours: float = 0.0  # simulated time
    booked_twice: int = 0  # GPUs over 100% after a move (checked, must stay 0)

    @property
    def moves_per_hour(self) -> float:
        return self.moves / self.hours if self.hours else 0.0


def lifetimes(mean_hours: float, tick_seconds: float, seed: int) -> Callable[[], int]:
    """Exponential lifetimes (mean `mean_hours`) in ticks, at least one, seeded."""
    rng = random.Random(f"lifetimes-{seed}")
    mean = mean_hours * HOUR / tick_seconds
    return lambda: max(1, round(rng.expovariate(1.0 / mean)))


class DefragReplay:
    def __init__(self, cluster: SimCluster, policy: Policy, settings: DefragSimSettings) -> None:
        self.cluster, self.policy, self.s = cluster, policy, settings
        policy.attach(cluster)
        self.leaving: list[tuple[int, int, int, Unit]] = []  # (tick, order, generation, unit)
        self.order = itertools.count()
        self.waiting: list[Unit] = []
        self.running: dict[str, Unit] = {}  # pod key -> its unit
        self.history: list[Migration] = []  # moves started, for the window limit
        self.renamed = itertools.count(1)
        self.out = DefragRun()

    def run(
        self, stream: Sequence[Arrival], lifetime: Callable[[], int], progress: Callable[[], None]
    ) -> DefragRun:
        every = max(1, round(self.s.interval / self.s.tick_seconds))
        sample = max(1, round(self.s.sample_every / self.s.tick_seconds))
        for tick, item in enumerate(stream):
            changed = self._depart(tick)
            if self.s.defrag and tick % every == 0 and self.waiting:
                changed = self._defrag(tick) or changed
            if changed:
                self._retry(tick)
            self._arrive(tick, item, lifetime())
            if tick % sample == 0:
                hour = tick * self.s.tick_seconds / HOUR
                self.out.blocks.append((hour, largest_block(self.cluster.core.nodes.values())))
            progress()
        self.out.never = [(u.gpus, len(u.members)) for u in self.waiting]
        self.out.hours = len(stream) * self.s.tick_seconds / HOUR
        return self.out

    # -- arrivals, departures, the queue ------------------------------------------------------------
    def _arrive(self, tick: int, item: Arrival, life: int) -> None:
        members = list(item.members) if isinstance(item, Gang) else [item]
        big = members[0].gpu_count >= self.s.queue_gpus and not members[0].sharing
        unit = Unit(members[0].key if len(members) == 1 else item.name, members, tick, life,
                    isinstance(item, Gang) or big, isinstance(item, Gang))  # fmt: skip
        if self._place(unit, tick):
            if unit.waits:
                self.out.waits.append((0.0, unit.gpus, len(members)))
        elif unit.waits:
            self.waiting.append(unit)

    def _place(self, unit: Unit, tick: int) -> bool:
        if not self.cluster.place(unit.members, self.policy).placed:
            return False
        self._start(unit, tick)
        return True

    def _start(self, unit: Unit, tick: int) -> None:
        unit.started = tick
        unit.generation += 1
        for m in unit.members:
            self.running[m.key] = unit
        heapq.heappush(self.leaving, (tick + unit.lifetime, next(self.order), unit.generation, unit))

    def _depart(self, tick: int) -> bool:
        freed = False
        while self.leaving and self.leaving[0][0] <= tick:
            _, _, generation, unit = heapq.heappop(self.leaving)
            if generation != unit.generation:
                continue  # it moved and restarted: this departure is void
            for m in unit.members:
                self.cluster.unassign(m)
                del self.running[m.key]
            freed = True
        return freed

    def _retry(self, tick: int) -> None:
        still = []
        for unit in self.waiting:
            if self._place(unit, tick):
                wait = (tick - unit.arrived) * self.s.tick_seconds
                self.out.waits.append((wait, unit.gpus, len(unit.members)))
            else:
                still.append(unit)
        self.waiting = still

    # -- defragmentation ----------------------------------------------------------------------------
    def _defrag(self, tick: int) -> bool:
        """Plan for the waiters that waited `min_wait`, start what the limits allow."""
        now = tick * self.s.tick_seconds
        waiters = [
            Waiter(f"{'gang' if u.gang else 'pod'} {u.name}", tuple(m.pod for m in u.members), HIGH)
            for u in self.waiting
            if (tick - u.arrived) * self.s.tick_seconds >= self.s.min_wait
        ]
        if not waiters:
            return False
        self.out.passes += 1
        plan = plan_defrag(self.cluster.core, waiters, self._facts(), self.s.planner, now=now)
        self.history = [m for m in self.history if now - m.created < self.s.limits.window]
        started = []
        for action in step(self.history, plan, self.s.limits, now, dry_run=False):
            if isinstance(action, CreateReservation):
                started.append(action.move)
            elif isinstance(action, Count) and action.label == "held":
                self.out.held += 1
        # A replacement may land where another mover of the same plan leaves: its room waits for
        # that pod to go (the controller's Reservation stays Pending until then), so the moves are
        # carried out in rounds until none more can be; what never fits is given up.
        moved = False
        while started:
            left = [m for m in started if not self._move(m, tick, now)]
            if len(left) == len(started):
                break
            moved, started = True, left
        self.out.given_up += len(started)
        return moved

    def _facts(self) -> list[PodFacts]:
        core = self.cluster.core
        out = []
        for key, unit in self.running.items():
            req = next(m for m in unit.members if m.key == key)
            out.append(
                PodFacts(
                    key,
                    core.pod_node[key],
                    HIGH if unit.waits else LOW,
                    req.pod,
                    max(req.gpu_count, 1 if req.sharing else 0),
                    owner_kind="" if unit.gang else "ReplicaSet",
                    workload=unit.name,
                    gang=unit.name if unit.gang else "",
                    started=unit.started * self.s.tick_seconds,
                    uid=key,
                )
            )
        return out

    def _move(self, move: Move, tick: int, now: float) -> bool:
        """The replacement on its target first (the room), then the pod leaves its node."""
        unit = self.running[move.key]
        old = next(m for m in unit.members if m.key == move.key)
        key = f"{old.key.split('~')[0]}~{next(self.renamed)}"
        new = replace(old, key=key, pod=replace(old.pod, key=key))
        room = plan_gang(self.cluster.core, [new.pod], self.s.planner.plan, names=[move.target])
        if not isinstance(room, GangPlan):
            return False
        target = self.cluster.index[move.target]
        self.cluster.assign(target, new, room.placements[0].allocation, observe=False)
        self.cluster.unassign(old)
        del self.running[old.key]
        unit.members = [new if m is old else m for m in unit.members]
        self._start(unit, tick)  # it restarts with its full duration
        self.out.moves += 1
        self.out.gpu_hours_lost += move.gpu_hours
        self.out.booked_twice += self._overbooked(target)
        # Done at once: the replacement runs on its room (bound and Ready).
        done = Migration(
            key, move.key, move.uid, move.workload, move.source, move.target, "Succeeded", now, True, False,
            ready=True,
        )  # fmt: skip
        self.history.append(done)
        return True

    def _overbooked(self, node: int) -> int:
        return sum(1 for pct in self.cluster.free_pct(node) if pct < 0)
