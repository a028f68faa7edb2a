"""What choosing a GPU set costs at bind time on nodes where NVLink differs between pairs.

`allocate()` (the bind path: the devices for one pod on the chosen node) on DGX-1 V100 nodes
(hw-fixtures/dgx1-v100) with random whole-GPU load, per request shape:

* cold: the chooser's caches (set qualities, packings, answers) emptied before every call;
* warm: the steady state, the caches filled by earlier calls on nodes of the same machine type.

Filter and prioritize never run the chooser (a node fits whenever enough GPUs are free), so this
is the whole extra cost per pod; `bench/extender.py --mix dgx1-v100` shows it end to end.
The script also runs on a checkout without the chooser, for a before/after.

Which sets it chooses, before and after a change: `--choices FILE` writes the GPUs `allocate()`
takes for every request size on every machine of hw-fixtures/ (and NVIDIA go-gpuallocator's three
test models, tests/support/gpuallocator.py) in every state of busy whole GPUs; `--compare FILE`
compares this checkout's choices with such a file and prints, per machine, how many changed and
whether any got a worse bottleneck or total (by this checkout's pair values) or a lower
go-gpuallocator score.

Run: `.venv/bin/python bench/gpu_sets.py [--nodes 200] [--repeat 5] [--seed 1]`,
`... --choices before.json` (on the old checkout), `... --compare before.json`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from itertools import combinations
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
WHOLE = {"koordinator.sh/gpu-core": 100, "koordinator.sh/gpu-memory-ratio": 100}


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


def machines() -> dict[str, dict]:
    """Device CRs of every hw-fixture with GPUs, and of go-gpuallocator's models when present."""
    out = {}
    for path in sorted((REPO / "hw-fixtures").glob("*/expected-device.yaml")):
        device = yaml.safe_load(path.read_text())
        if any(d.get("type") == "gpu" for d in (device.get("spec") or {}).get("devices") or ()):
            out[path.parent.name] = device
    try:
        from tests.support import gpuallocator as ga
    except ImportError:  # pragma: no cover - a checkout from before the models
        return out
    for model in ga.MODELS:
        out[model.name.split(" (")[0]] = ga.model_device(model)
    return out


def choices() -> dict[str, dict[str, list[int] | None]]:
    """machine -> "busy mask:size" -> the GPUs allocate() takes (None: it does not fit)."""
    from apis.annotations import DeviceAllocations
    from tests.support.allocations import entry

    out: dict[str, dict[str, list[int] | None]] = {}
    for name, device in machines().items():
        inv = build_inventory(device, {})
        minors = [s.minor for s in inv.slots("gpu")]
        got: dict[str, list[int] | None] = {}
        for busy in range(1 << len(minors)):
            held = [m for i, m in enumerate(minors) if busy >> i & 1]
            for size in range(1, len(minors) - len(held) + 1):
                state = NodeState(name, inv, {})
                if held:
                    state.add_pod("bench/busy", DeviceAllocations({"gpu": [entry(m, WHOLE) for m in held]}))
                result = allocate(state, pod_request(_pod("p", size)))
                got[f"{busy}:{size}"] = result.minors("gpu") if isinstance(result, Allocation) else None
        out[name] = got
    return out


def _quality(ic: object, gpus: list[int] | None, table: str = "values") -> tuple[int, int]:
    """(bottleneck, total) of a set by the interconnect matrix's `table`."""
    if not gpus or ic is None or len(gpus) < 2:
        return (0, 0)
    rows = getattr(ic, table)
    vals = [rows[ic.index(a)][ic.index(b)] for a, b in combinations(gpus, 2)]  # type: ignore[attr-defined]
    return (min(vals), sum(vals))


def compare(before_path: Path) -> None:
    """This checkout's choices against an earlier checkout's (`--choices`)."""
    from tests.support import gpuallocator as ga

    models = {m.name.split(" (")[0]: m for m in ga.MODELS}
    before = json.loads(before_path.read_text())
    devices = machines()
    print(
        "| machine | requests (states x sizes) | same set | other set | worse bottleneck or total "
        "| better PCIe relation | lower go-gpuallocator score |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, got in choices().items():
        old = before.get(name, {})
        ic = build_inventory(devices[name], {}).interconnect
        same = other = worse = finer = lower = 0
        for key, gpus in got.items():
            was = old.get(key, gpus)
            if was == gpus:
                same += 1
                continue
            other += 1
            now_q, was_q = _quality(ic, gpus), _quality(ic, was)
            worse += now_q < was_q
            finer += now_q == was_q and _quality(ic, gpus, "pcie_values") > _quality(ic, was, "pcie_values")
            if name in models and gpus and was:
                lower += ga.set_score(models[name], gpus) < ga.set_score(models[name], was)
        score = lower if name in models else "-"
        print(f"| {name} | {len(got)} | {same} | {other} | {worse} | {finer} | {score} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--choices", type=Path, help="write the sets chosen on every machine and state")
    parser.add_argument("--compare", type=Path, help="compare the sets chosen with a --choices file")
    args = parser.parse_args(argv)
    if args.choices:
        args.choices.write_text(json.dumps(choices(), sort_keys=True))
        return 0
    if args.compare:
        compare(args.compare)
        return 0
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
