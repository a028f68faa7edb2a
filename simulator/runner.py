"""Run the paper protocol for many (policy, seed) pairs in parallel, or a workload of jobs and
gangs on a chosen cluster, and summarise the results."""

from __future__ import annotations

import math
import os
import random
import statistics
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from simulator.cluster import SimCluster
from simulator.engine import POLICIES, RunResult, run_paper, run_replay
from simulator.nodes import NodeObjects
from simulator.openb import (
    TraceError,
    load_nodes,
    load_pods,
    resolve_trace,
    trace_label,
)
from simulator.protocol import target_workload
from simulator.workload import Workload, arrivals, target_mix, trace_pods

REPORT_AT = 100  # arrived %, where the paper reads its bars


@dataclass
class TraceRuns:
    trace: str
    seeds: list[int]
    runs: dict[str, list[RunResult]] = field(default_factory=dict)  # policy -> runs in seed order

    def per_seed(self, policy: str, arrived: int = REPORT_AT) -> list[float]:
        return [r.unallocated_at(arrived) for r in self.runs[policy]]

    def mean_sd(self, policy: str, arrived: int = REPORT_AT) -> tuple[float, float]:
        return mean_sd(self.per_seed(policy, arrived))

    def to_json(self) -> dict:
        """The issue's schema: unallocated GPU % at 100% arrived, per policy."""
        policies = {}
        for name in self.runs:
            mean, sd = self.mean_sd(name)
            policies[name] = {
                "mean": _number(mean),
                "sd": _number(sd),
                "per_seed": [_number(v) for v in self.per_seed(name)],
            }
        return {"trace": self.trace, "seeds": self.seeds, "policies": policies}


def _number(value: float) -> float | None:
    """Rounded for JSON; null where a run has no value (JSON has no NaN)."""
    return None if math.isnan(value) else round(value, 4)


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample SD of the values that are numbers (NaN: a run whose curve has no point
    there, e.g. one arrival jumped past it); NaN when none is."""
    kept = [v for v in values if not math.isnan(v)]
    if not kept:
        return math.nan, math.nan
    return statistics.fmean(kept), statistics.stdev(kept) if len(kept) > 1 else 0.0


# Worker-process globals: each worker loads the trace once.
_WORKER: dict[str, object] = {}


def _init_worker(trace_path: str, nodes_path: str | None = None) -> None:
    nodes = load_nodes(Path(nodes_path) if nodes_path else None)
    pods = load_pods(Path(trace_path))
    _WORKER.update(nodes=nodes, pods=pods, mix=target_workload(pods))


def _run_one(policy: str, seed: int) -> RunResult:
    return run_paper(_WORKER["nodes"], _WORKER["pods"], _WORKER["mix"], policy, seed)  # type: ignore[arg-type]


def run_trace(
    trace: str | Path,
    policies: Sequence[str],
    seeds: Sequence[int],
    workers: int | None = None,
    show_progress: bool = True,
    nodes_path: Path | None = None,
) -> TraceRuns:
    """All (policy, seed) runs of one trace, spread over ``workers`` processes (default: the CPUs
    this process may use), with a progress bar over runs. The cluster is the paper's 1,213 openb
    GPU nodes unless ``nodes_path`` names another node CSV."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)}; known: {', '.join(POLICIES)}")
    path = resolve_trace(trace)
    result = TraceRuns(trace_label(path), list(seeds))
    jobs = [(p, s) for p in policies for s in seeds]
    nodes_arg = None if nodes_path is None else str(nodes_path)
    workers = workers or len(os.sched_getaffinity(0))
    done: dict[tuple[str, int], RunResult] = {}
    bar = tqdm(total=len(jobs), desc=f"simulate {result.trace}", unit="run", disable=not show_progress)
    if workers <= 1:
        _init_worker(str(path), nodes_arg)
        for p, s in jobs:
            done[(p, s)] = _run_one(p, s)
            bar.update(1)
    else:
        with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(str(path), nodes_arg)) as pool:
            futures = {pool.submit(_run_one, p, s): (p, s) for p, s in jobs}
            for fut in as_completed(futures):
                done[futures[fut]] = fut.result()
                bar.update(1)
                p, s = futures[fut]
                bar.set_postfix_str(f"{p}/{s}: {done[(p, s)].unallocated_at(REPORT_AT):.2f}%")
    bar.close()
    for p in policies:
        result.runs[p] = [done[(p, s)] for s in seeds]
    return result


def median_curve(runs: Sequence[RunResult], attr: str) -> np.ndarray:
    stack = np.vstack([getattr(r.curves, attr) for r in runs])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # x with no point in any run stays NaN
        return np.nanmedian(stack, axis=0)


@dataclass(frozen=True)
class WorkloadSetup:
    """Per seed: the node rank the baselines break ties with, and the stream Random draws from."""

    seed: int
    node_rank: list[int]
    rng: random.Random


def workload_setup(nodes: int, seed: int) -> WorkloadSetup:
    rng = random.Random(seed)
    rank = list(range(nodes))
    rng.shuffle(rank)
    return WorkloadSetup(seed, rank, rng)


def run_workload(
    workload: Workload,
    node_objects: Sequence[NodeObjects],
    policies: Sequence[str],
    seeds: Sequence[int],
    show_progress: bool = True,
) -> TraceRuns:
    """Every (policy, seed) run of a workload on one cluster, in this process (workloads are small)."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)}; known: {', '.join(POLICIES)}")
    capacity = SimCluster(node_objects).capacity_pct
    if capacity == 0:
        raise TraceError("the cluster has no GPUs")
    original = trace_pods(workload.trace) if workload.trace is not None else []
    result = TraceRuns(workload.name, list(seeds))
    bar = tqdm(
        total=len(policies) * len(seeds),
        desc=f"simulate {workload.name}",
        unit="run",
        disable=not show_progress,
    )
    for seed in seeds:
        stream = arrivals(workload, capacity, seed, original)
        mix = target_mix(workload, original)
        for policy in policies:
            started = time.perf_counter()
            cluster = SimCluster(node_objects, tie_seed=seed, metrics_mix=mix)
            setup = workload_setup(cluster.size, seed)
            run = run_replay(cluster, stream, policy, POLICIES[policy](setup, mix), seed, started=started)
            result.runs.setdefault(policy, []).append(run)
            bar.update(1)
            bar.set_postfix_str(f"{policy}/{seed}: {run.unallocated_at(REPORT_AT):.2f}%")
    bar.close()
    result.runs = {p: result.runs[p] for p in policies}
    return result
