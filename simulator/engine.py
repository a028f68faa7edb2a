"""Replay one seed of the paper protocol with one policy: one pod at a time, no queue, no retry,
no departures; a pod that fits nowhere is dropped for good."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from allocator.core.scoring.workload_mix import WorkloadMix
from simulator.cluster import ClusterState, to_requests
from simulator.metrics import Curves, EventLog, curves
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
)
from simulator.protocol import PaperSetup, paper_setup

PolicyFactory = Callable[[PaperSetup, WorkloadMix], Policy]

POLICIES: dict[str, PolicyFactory] = {
    "random": lambda s, m: RandomPolicy(s.node_rank, s.rng),
    "dotprod": lambda s, m: DotProdPolicy(s.node_rank, s.rng),
    "gpupacking": lambda s, m: GpuPackingPolicy(s.node_rank, s.rng),
    "gpuclustering": lambda s, m: GpuClusteringPolicy(s.node_rank, s.rng),
    "bestfit": lambda s, m: BestFitPolicy(s.node_rank, s.rng),
    "fgd": lambda s, m: FgdPolicy(s.node_rank, s.rng, m),
    # production scorer, mix learned online from arrivals (no knowledge of the trace)
    "topoalloc": lambda s, m: TopoallocPolicy(s.node_rank, s.rng),
    # research comparison: the same scorer with FGD's target workload (from the whole trace, an
    # oracle) as a fixed mix; coverage 1 keeps the already-cut mix from being cut again
    "topoalloc-tracemix": lambda s, m: TopoallocPolicy(
        s.node_rank, s.rng, prior=m, prior_weight=1e12, coverage=1.0
    ),
}


@dataclass
class RunResult:
    policy: str
    seed: int
    pods: int
    failed: int
    curves: Curves
    seconds: float

    def unallocated_at(self, arrived_pct: int) -> float:
        return float(self.curves.unallocated[arrived_pct])


def replay(
    state: ClusterState, requests: Sequence, policy: Policy, progress: Callable[[int], None] | None = None
) -> tuple[EventLog, int]:
    """Place ``requests`` in order; returns the per-event log and the number of failed pods."""
    n = len(requests)
    arrived = np.zeros(n)
    allocated = np.zeros(n)
    fragmented = np.zeros(n)
    demand = 0
    failed = 0
    for k, req in enumerate(requests):
        demand += req.demand_pct
        policy.observe(req)
        feasible = state.feasible(req)
        if feasible.any():
            node, gpus = policy.select(state, req, feasible)
            state.place(node, req, gpus)
        else:
            failed += 1
        arrived[k] = demand
        allocated[k] = state.allocated_pct
        fragmented[k] = state.node_frag.sum()
        if progress is not None and k % 500 == 499:
            progress(500)
    if progress is not None:
        progress(n % 500)
    return EventLog(state.capacity_pct, arrived, allocated, fragmented), failed


def run_paper(
    nodes: Sequence[OpenbNode],
    trace_pods: Sequence[OpenbPod],
    mix: WorkloadMix,
    policy: str,
    seed: int,
    progress: Callable[[int], None] | None = None,
) -> RunResult:
    """One seed of the FGD paper protocol for one policy."""
    started = time.perf_counter()
    setup = paper_setup(nodes, trace_pods, seed)
    requests = to_requests(setup.pods)
    state = ClusterState(nodes, mix)
    chosen = POLICIES[policy](setup, mix)
    log, failed = replay(state, requests, chosen, progress)
    return RunResult(policy, seed, len(requests), failed, curves(log), time.perf_counter() - started)
