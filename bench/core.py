"""How long the allocator core takes to filter and score one pod against a whole cluster.

Clusters of 1,000 and 5,000 nodes, half DGX H100 and half 8x L40S (Device CRs from
hw-fixtures/<kind>/expected-device.yaml when recorded, else the equivalent CRs in
tests/support/machines.py), with random existing load: whole-GPU pods, half-GPU pods, RDMA VFs
taken, cpu and memory requested. For each request shape:

* cold: every node's verdict and score caches empty (a pod shape never seen before);
* warm: the previous pod of the same shape was just placed on the best node, so that node's
  caches are stale and every other node answers from its cache (the steady state).

Scoring is the extender's answer (`ClusterState.priorities`: fine scores, the stable tie order,
10 for the best node alone) with the default weights, the fragmentation term active.

Run: `.venv/bin/python bench/core.py [--nodes 1000 5000] [--repeat 5] [--seed 1]`.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from allocator.core.cluster.state import ClusterState
from allocator.core.devices.allocate import Allocation
from allocator.core.node.inventory import build_inventory
from allocator.core.node.state import NodeState
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from allocator.core.scoring.scorer import NodeScorer, ScoringConfig
from apis import keys
from apis.annotations import DeviceAllocations
from apis.device import Device
from tests.support.allocations import entry
from tests.support.machines import machine_device, uses_recorded_fixture

CORE, MEM, RATIO, RDMA = (
    "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory",
    "koordinator.sh/gpu-memory-ratio",
    "koordinator.sh/rdma",
)
MACHINES = {
    "dgx-h100": {"cpu": "224", "memory": "2015Gi", "pods": "250"},
    "l40s": {"cpu": "128", "memory": "1007Gi", "pods": "250"},
}


def _pod(name: str, requests: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "bench"}
    if annotations:
        meta["annotations"] = annotations
    return {
        "metadata": meta,
        "spec": {"containers": [{"resources": {"requests": requests, "limits": requests}}]},
    }


REQUESTS: dict[str, dict[str, Any]] = {
    "1 GPU": _pod("one", {"nvidia.com/gpu": "1", "cpu": "8", "memory": "64Gi"}),
    "2 GPUs": _pod("two", {"nvidia.com/gpu": "2", "cpu": "16", "memory": "128Gi"}),
    "4 GPUs": _pod("four", {"nvidia.com/gpu": "4", "cpu": "32", "memory": "256Gi"}),
    "8 GPUs": _pod("eight", {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi"}),
    "half GPU (shared)": _pod("half", {"koordinator.sh/gpu": "50", "cpu": "4", "memory": "16Gi"}),
    "4 GPUs + 4 VFs (joint)": _pod(
        "joint",
        {"nvidia.com/gpu": "4", RDMA: "1", "cpu": "32", "memory": "256Gi"},
        {
            keys.DEVICE_ALLOCATE_HINT: '{"rdma":{"vfSelector":{}}}',
            keys.DEVICE_JOINT_ALLOCATE: '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}',
        },
    ),
}


def _load(state: NodeState, rng: random.Random) -> None:
    """Random existing load: some GPUs whole, some half-used, a VF per whole GPU where NICs exist."""
    inv = state.inventory
    assert inv is not None
    gpus = list(inv.gpu_minors)
    rng.shuffle(gpus)
    busy = rng.choice((0, 0, 1, 2, 2, 3, 4, 4, 5, 6, 7, 8))
    half = rng.choice((0, 0, 1, 2))
    nics = list(inv.slots("rdma"))
    for i, minor in enumerate(gpus[:busy]):
        slot = inv.slot("gpu", minor)
        assert slot is not None
        gpu = entry(minor, {CORE: 100, RATIO: 100, MEM: slot.total[MEM]})
        by_type = {"gpu": [gpu]}
        near = [n for n in nics if n.pcie_scope == slot.pcie_scope]
        if near and near[0].vfs:
            taken = state.vf_taken.get("rdma", {}).get(near[0].minor, set())
            free = [vf.bus_id for vf in near[0].vfs if vf.bus_id not in taken]
            if free:
                by_type["rdma"] = [entry(near[0].minor, {RDMA: 1}, free[0])]
        state.add_pod(f"load/{state.name}-{i}", DeviceAllocations(by_type), 8000, 64 * 2**30)
    for j, minor in enumerate(gpus[busy : busy + half]):
        slot = inv.slot("gpu", minor)
        assert slot is not None
        gpu = entry(minor, {CORE: 50, RATIO: 50, MEM: slot.total[MEM] // 2})
        state.add_pod(f"load/{state.name}-h{j}", DeviceAllocations({"gpu": [gpu]}), 4000, 16 * 2**30)


def build_cluster(nodes: int, seed: int) -> ClusterState:
    rng = random.Random(seed)
    cluster = ClusterState()
    for i in range(nodes):
        kind = "dgx-h100" if i % 2 == 0 else "l40s"
        name = f"{kind}-{i:05d}"
        node = {
            "metadata": {"name": name, "labels": dict(machine_device(kind)["metadata"]["labels"])},
            "status": {"allocatable": MACHINES[kind]},
        }
        cluster.upsert_node(node)
        device = Device.from_dict(machine_device(kind, name))
        state = cluster.nodes[name]
        state.set_inventory(build_inventory(device, state.labels))
        _load(state, rng)
    return cluster


def _cycle(
    cluster: ClusterState, req: PodRequest, scorer: NodeScorer, names: list[str]
) -> tuple[float, list[str]]:
    gc.collect()  # time the pod, not the collection of the previous round's garbage
    start = time.perf_counter()
    passed, _ = cluster.feasible(req, names)
    scores = cluster.priorities(req, passed, scorer)  # the extender's prioritize answer
    elapsed = time.perf_counter() - start
    ranked = sorted(passed, key=lambda n: -scores[n])  # the one 10 first
    return elapsed, ranked


def _clear_caches(cluster: ClusterState) -> None:
    cluster.forget_cached()
    for state in cluster.nodes.values():
        state.forget_derived()


def measure(
    cluster: ClusterState, req: PodRequest, scorer: NodeScorer, repeat: int
) -> tuple[float, float, int]:
    names = list(cluster.nodes)
    cold, warm = [], []
    feasible = 0
    for r in range(repeat):
        _clear_caches(cluster)
        elapsed, ranked = _cycle(cluster, req, scorer, names)
        cold.append(elapsed)
        feasible = len(ranked)
        if not ranked:
            continue
        # Place the pod on the best node, then time the next pod of the same shape.
        best = ranked[0]
        got = cluster.allocate(req, best, scorer.config.device_scoring)
        assert isinstance(got, Allocation), got
        key = f"bench/{req.name}-{r}"
        cluster.assign(key, best, got.devices, req.cpu_milli, req.memory)
        elapsed, _ = _cycle(cluster, req, scorer, names)
        warm.append(elapsed)
        cluster.unassign(key)
    return cold, warm, feasible


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    source = {
        k: "recorded" if uses_recorded_fixture(k) else "built from published topology" for k in MACHINES
    }
    print("machines: " + ", ".join(f"{k} ({v})" for k, v in source.items()))
    # The default scorer, its fragmentation term seeded with the shapes benchmarked here (a fresh
    # allocator learns them from its first placements).
    prior = [{"cpu": "8", "gpus": n, "weight": 1} for n in (1, 2, 4, 8)] + [
        {"cpu": "4", "gpuShare": 50, "gpus": 1}
    ]
    scorer = NodeScorer(ScoringConfig.from_dict({"fragmentation": {"prior": prior}}))
    rows = []
    for n in args.nodes:
        start = time.perf_counter()
        cluster = build_cluster(n, args.seed)
        print(f"built {n} nodes in {time.perf_counter() - start:.1f} s")
        for label, pod in REQUESTS.items():
            req = pod_request(pod)
            assert req.invalid is None, req.invalid
            cold, warm, feasible = measure(cluster, req, scorer, args.repeat)
            rows.append((n, label, feasible, cold, warm))
    print()
    print("median (best) of the repeats; the machine is shared, so the best is closest to the cost itself")
    widths = (5, 24, 8, 15, 13, 12)
    print(_row(("nodes", "request", "feasible", "cold ms", "warm ms", "cold us/node"), widths))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for n, label, feasible, cold, warm in rows:
        cells = (n, label, feasible, _ms(cold), _ms(warm), f"{statistics.median(cold) / n * 1e6:.2f}")
        print(_row(cells, widths))
    return 0


def _ms(samples: list[float]) -> str:
    if not samples:
        return "-"
    return f"{statistics.median(samples) * 1e3:.2f} ({min(samples) * 1e3:.2f})"


def _row(cells: tuple[Any, ...], widths: tuple[int, ...]) -> str:
    out = []
    for i, (cell, width) in enumerate(zip(cells, widths, strict=True)):
        out.append(f"{cell:<{width}}" if i == 1 else f"{cell!s:>{width}}")
    return "| " + " | ".join(out) + " |"


if __name__ == "__main__":
    sys.exit(main())
