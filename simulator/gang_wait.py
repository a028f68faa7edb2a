"""Gang wait: the same arrivals with departures and a queue for gangs.

The paper-protocol replay has no departures, so a gang is placed on arrival or never. Here time
advances one tick per arrival; every placed pod or gang leaves after a lifetime drawn from a
seeded exponential distribution (a gang leaves whole). A gang that does not fit waits; after
every tick in which something left, the waiting gangs are tried again in arrival order (no
head-of-line blocking, as a coscheduling queue retries each group). A lone pod that fits
nowhere is dropped, as in the replay. A gang's wait is the ticks from its arrival to all its
members bound; gangs still waiting after the last arrival count as never placed. The
placements' GPU sets are counted as in the replay (`quality.QualityStats`), so the NVLink shares
of this run stand beside its waits: a policy that makes gangs start by taking NVLink from the pods
placed meanwhile shows it here.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from simulator.cluster import SimCluster, SimRequest, Step
from simulator.engine import POLICIES, Arrival
from simulator.gang_planner import Gang
from simulator.nodes import NodeObjects
from simulator.policies import Policy
from simulator.quality import NVLINK, PCIE, QualityStats, record
from simulator.runner import workload_setup
from simulator.workload import Workload, arrivals, target_mix, trace_pods


@dataclass
class GangWaits:
    """One run: the wait (ticks) of every gang that was placed, the gangs never placed, and the
    GPU sets of everything placed."""

    waits: list[int] = field(default_factory=list)
    never: int = 0
    quality: QualityStats = field(default_factory=QualityStats)

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.waits, q)) if self.waits else math.nan


def exponential_lifetime(mean: float, rng: random.Random) -> Callable[[], int]:
    """Lifetimes in ticks, exponential with ``mean``, at least one tick."""
    return lambda: max(1, round(rng.expovariate(1.0 / mean)))


def replay_queued(
    cluster: SimCluster, stream: Sequence[Arrival], policy: Policy, lifetime: Callable[[], int]
) -> GangWaits:
    """Place ``stream`` one arrival per tick with departures and a gang queue (module docstring)."""
    policy.attach(cluster)
    leaving: list[tuple[int, int, tuple[SimRequest, ...]]] = []  # (tick, order, members)
    waiting: list[tuple[int, Gang]] = []  # (arrival tick, gang), in arrival order
    out = GangWaits()
    order = itertools.count()  # keeps heap entries with equal ticks apart

    def placed(tick: int, step: Step) -> None:
        for p in step.placed:
            record(out.quality, p.req, p, 0.0)
        heapq.heappush(leaving, (tick + lifetime(), next(order), tuple(p.req for p in step.placed)))

    for tick, item in enumerate(stream):
        freed = False
        while leaving and leaving[0][0] <= tick:
            for member in heapq.heappop(leaving)[2]:
                cluster.unassign(member)
            freed = True
        if freed and waiting:
            still = []
            for since, gang in waiting:
                step = cluster.place(gang.members, policy)
                if step.placed:
                    out.waits.append(tick - since)
                    placed(tick, step)
                else:
                    still.append((since, gang))
            waiting = still
        if isinstance(item, Gang):
            step = cluster.place(item.members, policy)
            if step.placed:
                out.waits.append(0)
                placed(tick, step)
            else:
                waiting.append((tick, item))
            continue
        step = cluster.place((item,), policy)
        if step.placed:
            placed(tick, step)
    out.never = len(waiting)
    return out


def run_gang_waits(
    workload: Workload,
    node_objects: Sequence[NodeObjects],
    policies: Sequence[str],
    seeds: Sequence[int],
    mean_lifetime: float,
) -> dict[str, list[GangWaits]]:
    """Every (policy, seed): the workload's arrivals with departures (mean lifetime in arrivals)."""
    original = trace_pods(workload.trace) if workload.trace is not None else []
    capacity = SimCluster(node_objects).capacity_pct
    mix = target_mix(workload, original)
    out: dict[str, list[GangWaits]] = {p: [] for p in policies}
    for seed in seeds:
        stream = arrivals(workload, capacity, seed, original)
        for policy in policies:
            cluster = SimCluster(node_objects, tie_seed=seed, metrics_mix=mix)
            chosen = POLICIES[policy](workload_setup(cluster.size, seed), mix)
            rng = random.Random(f"lifetimes-{seed}")
            out[policy].append(
                replay_queued(cluster, stream, chosen, exponential_lifetime(mean_lifetime, rng))
            )
    return out


def format_gang_waits(results: dict[str, list[GangWaits]], mean_lifetime: float) -> str:
    """Per policy: gang wait p50 and p99 (ticks, over the gangs placed in all seeds pooled), gangs
    never placed (mean ± SD over seeds), and in the same runs the NVLink share of the placed 2-,
    4- and 8-GPU pods and the joint GPU+NIC pods' share with the NIC on each GPU's switch (seeds
    pooled)."""
    seeds = len(next(iter(results.values()), []))
    lines = [
        f"gang wait with departures (lifetime exponential, mean {mean_lifetime:g} arrivals; {seeds} seeds; "
        "wait in arrivals, seeds pooled; NVLink % of the pods placed in the same runs)",
        f"{'policy':<12} {'gangs placed':>13} {'wait p50':>9} {'wait p99':>9} {'never placed':>14} "
        f"{'NVLink % 2/4/8 GPU':>20} {'NIC on switch %':>16}",
    ]
    for policy, runs in results.items():
        waits = GangWaits([w for r in runs for w in r.waits])
        never = [float(r.never) for r in runs]
        sd = statistics.stdev(never) if len(never) > 1 else 0.0
        pooled = QualityStats()
        for r in runs:
            pooled.merge(r.quality)
        nvlink = " / ".join(f"{pooled.level_pct(NVLINK, g):.1f}" for g in (2, 4, 8))
        lines.append(
            f"{policy:<12} {len(waits.waits):>13} {waits.percentile(50):9.1f} {waits.percentile(99):9.1f} "
            f"{statistics.fmean(never):8.1f} ± {sd:3.1f} {nvlink:>20} {pooled.nic_pct(PCIE):16.1f}"
        )
    return "\n".join(lines)
