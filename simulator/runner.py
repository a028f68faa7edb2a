"""Run the paper protocol for many (policy, seed) pairs in parallel and summarise the results."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from simulator.engine import POLICIES, RunResult, run_paper
from simulator.openb import OpenbNode, OpenbPod, load_nodes, load_pods, resolve_trace, trace_label
from simulator.protocol import target_workload

REPORT_AT = 100  # arrived %, where the paper reads its bars


@dataclass
class TraceRuns:
    trace: str
    seeds: list[int]
    runs: dict[str, list[RunResult]] = field(default_factory=dict)  # policy -> runs in seed order

    def per_seed(self, policy: str, arrived: int = REPORT_AT) -> list[float]:
        return [r.unallocated_at(arrived) for r in self.runs[policy]]

    def mean_sd(self, policy: str, arrived: int = REPORT_AT) -> tuple[float, float]:
        values = self.per_seed(policy, arrived)
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0

    def to_json(self) -> dict:
        """The issue's schema: unallocated GPU % at 100% arrived, per policy."""
        policies = {}
        for name in self.runs:
            mean, sd = self.mean_sd(name)
            policies[name] = {
                "mean": round(mean, 4),
                "sd": round(sd, 4),
                "per_seed": [round(v, 4) for v in self.per_seed(name)],
            }
        return {"trace": self.trace, "seeds": self.seeds, "policies": policies}


# Worker-process globals: each worker loads the trace once.
_WORKER: dict[str, object] = {}


def _init_worker(trace_path: str) -> None:
    nodes = load_nodes()
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
) -> TraceRuns:
    """All (policy, seed) runs of one trace, spread over ``workers`` processes (default: the CPUs
    this process may use), with a progress bar over runs."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)}; known: {', '.join(POLICIES)}")
    path = resolve_trace(trace)
    result = TraceRuns(trace_label(path), list(seeds))
    jobs = [(p, s) for p in policies for s in seeds]
    workers = workers or len(os.sched_getaffinity(0))
    done: dict[tuple[str, int], RunResult] = {}
    bar = tqdm(total=len(jobs), desc=f"simulate {result.trace}", unit="run", disable=not show_progress)
    if workers <= 1:
        _init_worker(str(path))
        for p, s in jobs:
            done[(p, s)] = _run_one(p, s)
            bar.update(1)
    else:
        with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(str(path),)) as pool:
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


def load_cluster_and_trace(trace: str | Path) -> tuple[list[OpenbNode], list[OpenbPod]]:
    return load_nodes(), load_pods(resolve_trace(trace))


def median_curve(runs: Sequence[RunResult], attr: str) -> np.ndarray:
    stack = np.vstack([getattr(r.curves, attr) for r in runs])
    return np.nanmedian(stack, axis=0)
