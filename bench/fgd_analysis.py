"""Where a policy's unallocated GPU at 100% arrived comes from (the FGD paper protocol).

    .venv/bin/python bench/fgd_analysis.py [TRACE] [--seeds 42-46] [--policy fgd]

Replays the trace until arrived GPU demand reaches cluster capacity, then prints (markdown):
rejected GPU demand by pod kind and cause and idle GPU capacity by kind. At 100% arrived, idle
capacity = rejected demand (allocated = arrived − rejected = capacity − rejected), so both tables
add up to the same number.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simulator.cluster import FULL, SimCluster, SimRequest
from simulator.engine import POLICIES, OpenbRequests, openb_cluster
from simulator.openb import load_nodes, load_pods, resolve_trace
from simulator.protocol import paper_setup, parse_seeds, target_workload


def pod_kind(req: SimRequest) -> str:
    if req.gpu_count == 0:
        return "CPU-only"
    if req.models:
        return "constrained " + "|".join(req.models)
    if req.sharing:
        return "share 0.81" if req.gpu_pct == 81 else f"share {'<' if req.gpu_pct < 50 else '≥'} 0.5"
    return f"{req.gpu_count} GPU"


def reject_cause(state: SimCluster, req: SimRequest) -> str:
    """Why no node takes the pod, checking the GPU shape, then the model, CPU, memory."""
    if req.gpu_count:
        if req.sharing:
            gpu = state.gpu_free_max >= req.gpu_pct
            if not gpu.any():
                return "no GPU with the share free"
        else:
            gpu = state.gpu_full_count >= req.gpu_count
            if not gpu.any():
                return f"no node with {req.gpu_count} free GPUs"
        if req.models:
            gpu = gpu & np.array([m in req.models for m in state.models])
            if not gpu.any():
                return "GPU model"
    else:
        gpu = np.ones(state.size, dtype=bool)
    cpu = gpu & (state.cpu_free >= req.cpu_milli)
    if not cpu.any():
        return "CPU (GPU fits, CPU short)"
    return "memory (GPU and CPU fit)"


@dataclass
class Snapshot:
    """Idle GPU at 100% arrived and rejected demand until then, in GPU percent."""

    capacity_pct: int
    rejected: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    rejected_pods: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    idle: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    unallocated_pct: float = 0.0


def _fits(state: SimCluster, node: int, shape_req: SimRequest, gpu_ok: bool) -> bool:
    return (
        gpu_ok
        and state.cpu_free[node] >= shape_req.cpu_milli
        and state.mem_free[node] >= shape_req.memory
        and (not shape_req.models or state.models[node] in shape_req.models)
    )


def classify_idle(
    state: SimCluster, contents: dict[tuple[int, int], list[int]], shapes: Sequence[SimRequest]
) -> dict[str, float]:
    """Idle GPU share by kind. ``shapes``: one request per distinct (cpu, memory, GPU, models)
    that arrived, the pods that could still have used the capacity."""
    share_shapes = [s for s in shapes if s.sharing]
    whole_shapes = [s for s in shapes if s.gpu_count and not s.sharing]
    out: dict[str, float] = defaultdict(float)
    for node in range(state.size):
        gpus = list(state.free_pct(node))
        if not any(gpus):
            continue
        model = state.models[node]
        wanted = any(not s.models or model in s.models for s in shapes if s.gpu_count)
        full = gpus.count(FULL)
        for g, free in enumerate(gpus):
            if free == 0:
                continue
            if not wanted:
                out["idle on a model no pod asks for"] += free
                continue
            if free == FULL:
                if any(_fits(state, node, s, s.gpu_count <= full) for s in whole_shapes):
                    out["whole GPU, a whole-GPU pod still fits"] += free
                elif any(_fits(state, node, s, True) for s in share_shapes):
                    out["whole GPU, only sharing pods fit (CPU/mem)"] += free
                elif any(state.cpu_free[node] >= s.cpu_milli for s in share_shapes + whole_shapes):
                    out["whole GPU, memory-starved node"] += free
                else:
                    out["whole GPU, CPU-starved node"] += free
                continue
            held = contents.get((node, g), [])
            if free == 19 and 81 in held:
                label = "0.19 behind a 0.81 pod"
            elif free < min((s.gpu_pct for s in share_shapes), default=FULL):
                label = "partial, smaller than any share"
            elif any(_fits(state, node, s, s.gpu_pct <= free) for s in share_shapes):
                label = "partial, a sharing pod still fits"
            elif any(s.gpu_pct <= free for s in share_shapes):
                label = "partial, share fits but CPU/mem short"
            else:
                label = "partial, smaller than any share"
            out[label] += free
    return out


def analyse(trace: str, seed: int, policy: str) -> Snapshot:
    nodes = load_nodes()
    pods = load_pods(resolve_trace(trace))
    mix = target_workload(pods)
    setup = paper_setup(nodes, pods, seed)
    to_request = OpenbRequests()
    requests = [to_request(p) for p in setup.pods]
    state = openb_cluster(nodes, tie_seed=seed)
    chosen = POLICIES[policy](setup, mix)
    chosen.attach(state)
    snap = Snapshot(state.capacity_pct)
    contents: dict[tuple[int, int], list[int]] = defaultdict(list)
    demand = 0
    arrived: list[SimRequest] = []
    for req in requests:
        demand += req.demand_pct
        arrived.append(req)
        step = state.place((req,), chosen)
        if step.placed:
            (placed,) = step.placed
            if req.sharing:
                contents[(placed.node, placed.allocation.minors("gpu")[0])].append(req.gpu_pct)
        else:
            key = (pod_kind(req), reject_cause(state, req))
            snap.rejected[key] += req.demand_pct
            snap.rejected_pods[key] += 1
        if demand >= state.capacity_pct:
            break
    distinct = list({(r.cpu_milli, r.memory, r.gpu_pct, r.gpu_count, r.models): r for r in arrived}.values())
    snap.idle = classify_idle(state, contents, distinct)
    snap.unallocated_pct = (state.capacity_pct - state.allocated_pct) / state.capacity_pct * 100
    return snap


def _table(title: str, rows: dict, snaps: Sequence[Snapshot], counts: dict | None = None) -> str:
    lines = [f"| {title} | % of capacity (mean ± SD) |" + (" pods (mean) |" if counts else ""), "|---|---:|"]
    if counts:
        lines[1] += "---:|"
    keys = sorted(rows, key=lambda k: -statistics.fmean(rows[k]))
    for key in keys:
        values = rows[key]
        name = " / ".join(key) if isinstance(key, tuple) else key
        cell = f"| {name} | {statistics.fmean(values):.2f} ± {statistics.pstdev(values):.2f} |"
        if counts:
            cell += f" {statistics.fmean(counts[key]):.0f} |"
        lines.append(cell)
    total = [s.unallocated_pct for s in snaps]
    lines.append(f"| **total** | **{statistics.fmean(total):.2f}** |" + (" |" if counts else ""))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trace", nargs="?", default="default")
    parser.add_argument("--seeds", default="42-46")
    parser.add_argument("--policy", default="fgd")
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    snaps = [analyse(args.trace, s, args.policy) for s in seeds]
    cap = snaps[0].capacity_pct / 100.0

    def pct(d: dict) -> dict:
        keys = {k for s in snaps for k in getattr(s, d)}
        return {k: [getattr(s, d).get(k, 0.0) / cap for s in snaps] for k in keys}

    rejected_keys = {k for s in snaps for k in s.rejected}
    counts = {k: [s.rejected_pods.get(k, 0) for s in snaps] for k in rejected_keys}
    print(f"## {args.policy} on {args.trace}, seeds {seeds}: state when arrived demand reaches capacity\n")
    print(_table("rejected: pod kind / cause", pct("rejected"), snaps, counts))
    print()
    print(_table("idle GPU capacity by kind", pct("idle"), snaps))
    print()
    print(f"unallocated per seed: {', '.join(f'{s.unallocated_pct:.2f}' for s in snaps)}")


if __name__ == "__main__":
    main()
