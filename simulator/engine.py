"""Replay a stream of pods and gangs on the simulated cluster with one policy: one arrival at a time,
no queue, no retry, no departures; a pod (or gang) that fits nowhere is dropped for good."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from allocator.core.scoring.workload_mix import WorkloadMix
from simulator.cluster import RequestFactory, SimCluster, SimRequest
from simulator.gang_planner import Gang, members_of
from simulator.koordinator_policy import KoordinatorPolicy
from simulator.metrics import Curves, EventLog, curves
from simulator.objects import openb_node_objects, openb_pod_object
from simulator.openb import OpenbNode, OpenbPod
from simulator.policies import (
    BestFitPolicy,
    DotProdPolicy,
    FgdPolicy,
    GpuClusteringPolicy,
    GpuPackingPolicy,
    Policy,
    RandomPolicy,
    TopoallocPolicy,
    oracle_config,
)
from simulator.protocol import paper_setup
from simulator.quality import QualityStats, record

Arrival = SimRequest | Gang


class RunSetup(Protocol):
    """What a policy is built from: the seeded node rank for ties and the seeded stream."""

    node_rank: list[int]
    rng: random.Random


PolicyFactory = Callable[[RunSetup, WorkloadMix], Policy]

POLICIES: dict[str, PolicyFactory] = {
    "random": lambda s, m: RandomPolicy(s.node_rank, s.rng),
    "dotprod": lambda s, m: DotProdPolicy(s.node_rank, s.rng),
    "gpupacking": lambda s, m: GpuPackingPolicy(s.node_rank, s.rng),
    "gpuclustering": lambda s, m: GpuClusteringPolicy(s.node_rank, s.rng),
    "bestfit": lambda s, m: BestFitPolicy(s.node_rank, s.rng),
    "fgd": lambda s, m: FgdPolicy(s.node_rank, s.rng, m),
    # koord-scheduler's default scoring and Koordinator's own device allocation (no topoalloc extras)
    "koordinator": lambda s, m: KoordinatorPolicy(s.node_rank, s.rng),
    # the production scorer with its default config: mix learned from placed pods (no oracle)
    "topoalloc": lambda s, m: TopoallocPolicy(s.node_rank, s.rng),
    # research comparison: the same scorer planning for the trace's own mix (an oracle)
    "topoalloc-tracemix": lambda s, m: TopoallocPolicy(s.node_rank, s.rng, oracle_config(m)),
}


@dataclass
class ReplayStats:
    pods: int = 0
    failed: int = 0
    gangs: int = 0
    failed_gangs: int = 0


@dataclass
class RunResult:
    policy: str
    seed: int
    pods: int
    failed: int
    curves: Curves
    seconds: float
    gangs: int = 0
    failed_gangs: int = 0
    final_unallocated: float = float("nan")  # % of GPU capacity unallocated after the last pod
    quality: QualityStats | None = None  # topology and NIC pairing of the placed pods

    def unallocated_at(self, arrived_pct: int) -> float:
        return float(self.curves.unallocated[arrived_pct])


def count_pods(arrivals: Sequence[Arrival]) -> int:
    return sum(len(a.members) if isinstance(a, Gang) else 1 for a in arrivals)


def replay(
    cluster: SimCluster,
    arrivals: Sequence[Arrival],
    policy: Policy,
    quality: QualityStats | None = None,
) -> tuple[EventLog, ReplayStats]:
    """Place ``arrivals`` in order; returns the per-pod event log and the counts, and adds each
    placed pod's topology facts to ``quality`` when given."""
    n = count_pods(arrivals)
    arrived = np.zeros(n)
    allocated = np.zeros(n)
    fragmented = np.zeros(n)
    stats = ReplayStats()
    policy.attach(cluster)
    capacity = max(cluster.capacity_pct, 1)
    demand = 0
    k = 0
    for item in arrivals:
        members = members_of(item)
        step = cluster.place(members, policy)
        if not step.placed:
            stats.failed += len(members)
        if isinstance(item, Gang):
            stats.gangs += 1
            if not step.placed:
                stats.failed_gangs += 1
        placed = {p.req.key: p for p in step.placed}
        for member in members:
            demand += member.demand_pct
            arrived[k] = demand
            allocated[k] = step.allocated_pct
            fragmented[k] = step.fragmented
            k += 1
            if quality is not None:
                record(quality, member, placed.get(member.key), demand / capacity * 100.0)
    stats.pods = n
    return EventLog(cluster.capacity_pct, arrived, allocated, fragmented), stats


def run_replay(
    cluster: SimCluster,
    arrivals: Sequence[Arrival],
    policy_name: str,
    policy: Policy,
    seed: int,
    started: float | None = None,
) -> RunResult:
    started = time.perf_counter() if started is None else started
    quality = QualityStats()
    log, stats = replay(cluster, arrivals, policy, quality)
    capacity = max(cluster.capacity_pct, 1)
    return RunResult(
        policy_name,
        seed,
        stats.pods,
        stats.failed,
        curves(log),
        time.perf_counter() - started,
        stats.gangs,
        stats.failed_gangs,
        100.0 - cluster.allocated_pct / capacity * 100.0,
        quality,
    )


class OpenbRequests:
    """openb pods as Pod objects parsed by the core, once per distinct pod spec."""

    def __init__(self) -> None:
        self.factory = RequestFactory()

    def __call__(self, pod: OpenbPod) -> SimRequest:
        template = (pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli, pod.gpu_spec)
        return self.factory.request(openb_pod_object(pod), template)


def openb_cluster(
    nodes: Sequence[OpenbNode], tie_seed: int = 0, metrics_mix: WorkloadMix | None = None
) -> SimCluster:
    return SimCluster((openb_node_objects(n) for n in nodes), tie_seed=tie_seed, metrics_mix=metrics_mix)


def run_paper(
    nodes: Sequence[OpenbNode],
    trace_pods: Sequence[OpenbPod],
    mix: WorkloadMix,
    policy: str,
    seed: int,
) -> RunResult:
    """One seed of the FGD paper protocol for one policy, on the production core."""
    started = time.perf_counter()
    setup = paper_setup(nodes, trace_pods, seed)
    to_request = OpenbRequests()
    requests = [to_request(p) for p in setup.pods]
    cluster = openb_cluster(nodes, tie_seed=seed, metrics_mix=mix)
    chosen = POLICIES[policy](setup, mix)
    return run_replay(cluster, requests, policy, chosen, seed, started)
