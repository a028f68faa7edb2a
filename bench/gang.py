"""How long the gang planner takes to place a whole gang at once.

Clusters of 1,000 and 5,000 nodes from bench/core.py (half DGX H100, half 8x L40S, random load),
in racks of 16 nodes (label topoalloc.io/rack). Gangs of whole-GPU workers, from 8 one-GPU pods to
128 eight-GPU pods (1,024 GPUs). `cold`: every node's cached verdicts dropped first (a shape never
seen); `warm`: the same gang planned again right after (the controller retrying a waiting gang).
The planner never changes the cluster, so both run on the same state.

Run: `.venv/bin/python bench/gang.py [--nodes 1000 5000] [--repeat 3] [--seed 1]`.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import build_cluster  # bench/core.py

from allocator.core.cluster.state import ClusterState
from allocator.core.gang.plan import GangPlan, GangPlanSettings, plan_gang
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest

RACK = "topoalloc.io/rack"
GANGS = {"8 x 1 GPU": (8, 1), "64 x 1 GPU": (64, 1), "16 x 8 GPUs": (16, 8), "128 x 8 GPUs": (128, 8)}


def members(count: int, gpus: int) -> list[PodRequest]:
    requests = {"nvidia.com/gpu": str(gpus), "cpu": str(4 * gpus), "memory": f"{32 * gpus}Gi"}
    pod = {"spec": {"containers": [{"resources": {"requests": requests, "limits": requests}}]}}
    out = []
    for i in range(count):
        pod["metadata"] = {"name": f"w{i:03d}", "namespace": "bench", "labels": {"rl-job-group": "bench"}}
        out.append(pod_request(pod))
    return out


def racked(nodes: int, seed: int) -> ClusterState:
    cluster = build_cluster(nodes, seed)
    for i, state in enumerate(cluster.nodes.values()):
        state.set_labels({**state.labels, RACK: f"rack-{i // 16:03d}"})
    return cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    settings = GangPlanSettings(topology_keys=(RACK,))
    widths = (7, 14, 10, 10, 7, 18)
    print(_row(("nodes", "gang", "cold ms", "warm ms", "nodes", "domain"), widths))
    for count in args.nodes:
        cluster = racked(count, args.seed)
        for label, (size, gpus) in GANGS.items():
            gang = members(size, gpus)
            cold, warm = [], []
            plan = None
            for _ in range(args.repeat):
                for state in cluster.nodes.values():
                    state.forget_derived()
                gc.collect()
                start = time.perf_counter()
                plan = plan_gang(cluster, gang, settings)
                cold.append(time.perf_counter() - start)
                start = time.perf_counter()
                plan_gang(cluster, gang, settings)
                warm.append(time.perf_counter() - start)
            used = str(len(plan.nodes)) if isinstance(plan, GangPlan) else "none"
            domain = (plan.domain if isinstance(plan, GangPlan) else "") or "-"
            cells = (count, label, _ms(cold), _ms(warm), used, domain.removeprefix(f"{RACK}="))
            print(_row(cells, widths), flush=True)
    return 0


def _ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.1f}"


def _row(cells: tuple[object, ...], widths: tuple[int, ...]) -> str:
    return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True))


if __name__ == "__main__":
    sys.exit(main())
