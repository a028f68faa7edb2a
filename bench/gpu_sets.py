"""What choosing a GPU set costs at bind time on nodes where NVLink differs between pairs.

`allocate()` (the bind path: the devices for one pod on the chosen node) on DGX-1 V100 nodes
(hw-fixtures/dgx1-v100) with random whole-GPU load, per request shape:

* cold: the chooser's caches (set qualities, packings, answers) emptied before every call;
* warm: the steady state, the caches filled by earlier calls on nodes of the same machine type.

Filter and prioritize never run the chooser (a node fits whenever enough GPUs are free), so this
is the whole extra cost per pod; `bench/extender.py --mix dgx1-v100` shows it end to end.
The script also runs on a checkout without the chooser, for a before/after.

Run: `.venv/bin/python bench/gpu_sets.py [--nodes 200] [--repeat 5] [--seed 1]`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from allocator.core.devices.allocate import Allocation, allocate  # noqa: E402
from allocator.core.node.inventory import build_inventory  # noqa: E402
from allocator.core.node.state import NodeState  # noqa: E402
from allocator.core.request.parse import pod_request  # noqa: E402

try:  # absent on a checkout without the chooser
    from allocator.core.devices import gpu_sets as gpusets
except ImportError:  # pragma: no cover
    gpusets = None  # type: ignore[assignment]
try:  # the pair tables (allocator/core/node/gpu_pairs.py; inside gpu_sets.py before issue 32)
    from allocator.core.node import gpu_pairs
except ImportError:  # pragma: no cover
    gpu_pairs = None  # type: ignore[assignment]

DEVICE = REPO / "hw-fixtures" / "dgx1-v100" / "expected-device.yaml"
SHAPES = (1, 2, 3, 4, 8)


def _pod(name: str, gpus: int) -> dict:
    limits = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": limits, "limits": limits}}]},
    }


def nodes(count: int, rng: random.Random) -> list[NodeState]:
    device = yaml.safe_load(DEVICE.read_text())
    out = []
    for i in range(count):
        state = NodeState(f"dgx1-{i}", build_inventory(device, {}), {})
        for j in range(rng.choice((0, 1, 1, 2, 3))):
            got = allocate(state, pod_request(_pod(f"load-{i}-{j}", rng.choice((1, 1, 2, 4)))))
            if isinstance(got, Allocation):
                state.add_pod(f"bench/load-{i}-{j}", got.devices)
        out.append(state)
    return out


def _clear() -> None:
    if gpu_pairs is not None:
        gpu_pairs._TABLES.clear()
    if gpusets is not None:
        getattr(gpusets, "_MATRICES", {}).clear()
        gpusets._CHOICES.clear()


def measure(states: list[NodeState], gpus: int, *, cold: bool) -> float:
    """Mean microseconds per allocate() over the nodes where the pod fits."""
    req = pod_request(_pod("p", gpus))
    total, n = 0.0, 0
    for state in states:
        if cold:
            _clear()
        start = time.perf_counter()
        got = allocate(state, req)
        total += time.perf_counter() - start
        n += isinstance(got, Allocation)
    return 1e6 * total / max(len(states), 1) if n else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    states = nodes(args.nodes, random.Random(args.seed))
    print(f"{args.nodes} DGX-1 V100 nodes; chooser {'present' if gpusets is not None else 'absent'}")
    print("median (best) of the repeats, microseconds per allocate() call")
    print("| GPUs | cold us | warm us |")
    print("|------|---------|---------|")
    for gpus in SHAPES:
        cold = [measure(states, gpus, cold=True) for _ in range(args.repeat)]
        measure(states, gpus, cold=False)
        warm = [measure(states, gpus, cold=False) for _ in range(args.repeat)]
        print(
            f"| {gpus:>4} | {statistics.median(cold):7.0f} ({min(cold):.0f}) "
            f"| {statistics.median(warm):7.0f} ({min(warm):.0f}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
