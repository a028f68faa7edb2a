"""Reservations replayed: a job (a scheduled training run) whose room is reserved ahead of time.

The workload's jobs with `reserveAhead: N` get a Reservation N arrivals before they arrive. The
replay is the gang-wait one (simulator/gang_wait.py: one arrival per tick, exponential lifetimes,
a queue for gangs that do not fit): at its tick the Reservation is placed as the job's members
would be (all at once, through the same policy and core), and holds that room (each member's
devices, cpu and memory, under a room key) until the job arrives; a Reservation that does not fit
waits and is tried again whenever something leaves, as the Reservation controller does. When the
job arrives, each member takes exactly its room; a job whose Reservation was never placed queues
like any other. Two numbers per job, each against the same replay without Reservations:
  * the wait it saves: ticks from arrival to all members bound, without minus with;
  * the GPUs it idles: GPU share held by rooms from their placement to the job's arrival (GPU-ticks;
    GPU-hours with the length of a tick).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from allocator.core.devices.allocate import Allocation
from allocator.core.reservation.room import room_key
from apis.annotations import DeviceAllocations
from simulator.cluster import SimCluster, SimRequest
from simulator.engine import POLICIES, Arrival
from simulator.gang_planner import Gang
from simulator.gang_wait import exponential_lifetime
from simulator.nodes import NodeObjects
from simulator.policies import Policy
from simulator.runner import workload_setup
from simulator.workload import Workload, arrivals, target_mix, trace_pods

FULL = 100  # percent of one GPU


@dataclass
class ReservedRun:
    """One replay: each job's wait (ticks; absent: never placed) and the GPU-ticks rooms idled."""

    waits: dict[str, int] = field(default_factory=dict)
    idle_gpu_ticks: dict[str, float] = field(default_factory=dict)
    reserved: dict[str, bool] = field(default_factory=dict)  # whether the room was placed in time


def _members(item: Arrival) -> tuple[SimRequest, ...]:
    return item.members if isinstance(item, Gang) else (item,)


def _name(item: Arrival) -> str:
    if isinstance(item, Gang):
        return item.name
    return item.key.rsplit("/", 1)[-1].rsplit("-", 1)[0]


def replay_reserved(
    cluster: SimCluster,
    stream: Sequence[Arrival],
    policy: Policy,
    lifetime: Callable[[], int],
    leads: Mapping[str, int],
) -> ReservedRun:
    """The gang-wait replay with the jobs of `leads` reserved that many arrivals ahead."""
    policy.attach(cluster)
    out = ReservedRun()
    order = itertools.count()
    leaving: list[tuple[int, int, tuple[SimRequest, ...]]] = []
    waiting: list[tuple[int, str, tuple[SimRequest, ...]]] = []  # (since, job, members)
    due: dict[int, list[tuple[str, tuple[SimRequest, ...]]]] = {}  # tick -> Reservations made then
    rooms: dict[str, tuple[int, tuple[SimRequest, ...]]] = {}  # job -> (tick placed, room requests)
    unplaced: list[tuple[str, tuple[SimRequest, ...]]] = []
    jobs_at = {_name(item): tick for tick, item in enumerate(stream) if _name(item) in leads}
    for job, tick in jobs_at.items():
        members = tuple(replace(m, key=room_key(m.key)) for m in _members(stream[tick]))
        due.setdefault(max(0, tick - leads[job]), []).append((job, members))

    def placed(tick: int, members: tuple[SimRequest, ...]) -> None:
        heapq.heappush(leaving, (tick + lifetime(), next(order), members))

    def try_rooms(tick: int) -> None:
        nonlocal unplaced
        still = []
        for job, members in unplaced:
            if cluster.place(members, policy).placed:
                rooms[job] = (tick, members)
            else:
                still.append((job, members))
        unplaced = still

    for tick, item in enumerate(stream):
        freed = False
        while leaving and leaving[0][0] <= tick:
            for member in heapq.heappop(leaving)[2]:
                cluster.unassign(member)
            freed = True
        if freed and waiting:
            still_waiting = []
            for since, job, members in waiting:
                if cluster.place(members, policy).placed:
                    out.waits[job] = tick - since
                    placed(tick, members)
                else:
                    still_waiting.append((since, job, members))
            waiting = still_waiting
        unplaced.extend(due.pop(tick, ()))
        if unplaced:  # new ones at once, the others again (as the controller's passes do)
            try_rooms(tick)
        job = _name(item)
        members = _members(item)
        if job in rooms:
            since, room = rooms.pop(job)
            for member, held in zip(members, room, strict=True):
                _take(cluster, member, held)
            out.waits[job] = 0
            out.reserved[job] = True
            out.idle_gpu_ticks[job] = sum(m.demand_pct for m in members) / FULL * (tick - since)
            placed(tick, members)
            continue
        if job in leads:
            out.reserved[job] = False
            unplaced = [(j, m) for j, m in unplaced if j != job]
        if isinstance(item, Gang):
            if cluster.place(members, policy).placed:
                out.waits[job] = 0
                placed(tick, members)
            else:
                waiting.append((tick, job, members))
        elif cluster.place(members, policy).placed:
            out.waits.setdefault(job, 0)
            placed(tick, members)
    return out


def _take(cluster: SimCluster, member: SimRequest, room: SimRequest) -> None:
    """The member takes exactly its room: same node, same devices."""
    node = cluster.core.pod_node.get(room.key)
    assert node is not None
    i = cluster.index[node]
    held = cluster.states[i].pods[room.key].allocations
    cluster.unassign(room)
    cluster.assign(i, member, Allocation(held if held is not None else DeviceAllocations({})))


@dataclass
class JobSummary:
    job: str
    lead: int
    wait_without: list[float] = field(default_factory=list)
    wait_with: list[float] = field(default_factory=list)
    idle_gpu_ticks: list[float] = field(default_factory=list)
    in_time: int = 0


def run_reservations(
    workload: Workload,
    node_objects: Sequence[NodeObjects],
    policies: Sequence[str],
    seeds: Sequence[int],
    mean_lifetime: float,
) -> dict[str, list[JobSummary]]:
    """Per policy, per reserved job: its wait with and without the Reservation, and what it idled."""
    leads = {job.name: job.reserve_ahead for job in workload.jobs if job.reserve_ahead > 0}
    original = trace_pods(workload.trace) if workload.trace is not None else []
    capacity = SimCluster(node_objects).capacity_pct
    mix = target_mix(workload, original)
    out = {p: [JobSummary(j, lead) for j, lead in leads.items()] for p in policies}
    for seed in seeds:
        stream = arrivals(workload, capacity, seed, original)
        for policy in policies:
            runs = []
            for with_leads in ({}, leads):
                cluster = SimCluster(node_objects, tie_seed=seed, metrics_mix=mix)
                chosen = POLICIES[policy](workload_setup(cluster.size, seed), mix)
                rng = random.Random(f"lifetimes-{seed}")
                runs.append(
                    replay_reserved(
                        cluster, stream, chosen, exponential_lifetime(mean_lifetime, rng), with_leads
                    )
                )
            for summary in out[policy]:
                summary.wait_without.append(runs[0].waits.get(summary.job, math.inf))
                summary.wait_with.append(runs[1].waits.get(summary.job, math.inf))
                summary.idle_gpu_ticks.append(runs[1].idle_gpu_ticks.get(summary.job, 0.0))
                summary.in_time += bool(runs[1].reserved.get(summary.job))
    return out


def format_reservations(
    results: dict[str, list[JobSummary]], mean_lifetime: float, tick_seconds: float
) -> str:
    """Per policy and reserved job: in how many seeds the room was placed in time, how often the job
    was placed at all and its mean wait (over the seeds it was placed) without and with the
    Reservation, and the GPU-hours its room idled (mean over seeds)."""
    first = next(iter(results.values()), [])
    seeds = len(first[0].wait_with) if first else 0
    lines = [
        f"reserved jobs (lifetime exponential, mean {mean_lifetime:g} arrivals; a tick = one arrival = "
        f"{tick_seconds:g} s; {seeds} seeds; waits in ticks, mean over the seeds placed)",
        f"{'policy':<12} {'job':<14} {'ahead':>6} {'in time':>8} {'placed without':>15} {'wait':>7} "
        f"{'placed with':>12} {'wait':>7} {'GPU-hours idled':>16}",
    ]
    for policy, jobs in results.items():
        for s in jobs:
            n = len(s.wait_with)
            idled = statistics.fmean(s.idle_gpu_ticks) * tick_seconds / 3600 if s.idle_gpu_ticks else 0.0
            lines.append(
                f"{policy:<12} {s.job:<14} {s.lead:>6} {f'{s.in_time}/{n}':>8} "
                f"{_placed(s.wait_without):>15} {_mean_wait(s.wait_without):>7} "
                f"{_placed(s.wait_with):>12} {_mean_wait(s.wait_with):>7} {idled:16.1f}"
            )
    return "\n".join(lines)


def _placed(waits: list[float]) -> str:
    return f"{sum(1 for w in waits if math.isfinite(w))}/{len(waits)}"


def _mean_wait(waits: list[float]) -> str:
    done = [w for w in waits if math.isfinite(w)]
    return f"{statistics.fmean(done):.1f}" if done else "-"
