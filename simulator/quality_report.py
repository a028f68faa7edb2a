"""The allocation-quality comparison: the topology workload on the mixed hw-fixture cluster, every
policy, a table of packing, gang and topology metrics (mean ± SD over seeds), JSON and a plot of
topology level against load (`bench/quality.py`, `topoalloc simulate --workload ... --quality`)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from simulator.engine import RunResult
from simulator.quality import NO_TOPOLOGY, NUMA, NVLINK, PCIE, QualityStats, binned_share, equal_count_edges
from simulator.runner import REPORT_AT, TraceRuns, mean_sd

TOPOLOGY_WORKLOAD = Path(__file__).resolve().parent / "data" / "topology-workload.yaml"
# 16 DGX H100 (128 GPUs, NVSwitch, a NIC per GPU switch), 24 A100 PCIe with NVLink pairs (96),
# 16 L40S PCIe (128), 16 L20 VMs (64), 8 CPU-only: 80 nodes, 416 GPUs.
TOPOLOGY_NODES = (
    "hw-fixtures:dgx-h100=16,a100-pcie-4x-nvlink-pairs=24,l40s-8x-pcie=16,"
    "l20-4x-vm-numa-unknown=16,cpu-only=8"
)
QUALITY_POLICIES = ("random", "bestfit", "fgd", "koordinator", "topoalloc")
SIZES = (2, 4, 8)
#: A per-size table (and the demo's NVLink column) needs this many pods of that size over all
#: seeds: a percentage of fewer ("66.7 ± 51.6" from 0.7 pods a seed) says nothing.
HANDFUL = 10
FEW = 5  # the plot's points: a share of fewer placed pods is left out (the count still shows)

Metric = Callable[[RunResult], float]
BEST_LINK = (
    "multi-GPU on node's best link: the placed multi-GPU pods whose GPUs share the best link the node "
    "they landed on offers that many GPUs (NVLink on a DGX, PCIe or less on an L40S); the NVLink % "
    "below (and the short table's multi-GPU on NVLink) counts one NVLink domain only."
)


def _q(run: RunResult) -> QualityStats:
    return run.quality if run.quality is not None else QualityStats()


def packing_metrics() -> list[tuple[str, str, Metric]]:
    """(key, column title, per-run value): packing, gangs and NIC pairing."""
    return [
        ("unallocated_pct", "idle GPU % at 100%", lambda r: r.unallocated_at(REPORT_AT)),
        ("pods_failed", "pods not placed", lambda r: float(r.failed)),
        ("gangs_never_placed", "gangs not placed", lambda r: float(r.failed_gangs)),
        ("multi_at_best_pct", "multi-GPU on node's best link %", lambda r: _q(r).at_best_pct()),
        ("nic_same_pcie_pct", "NIC on GPU's switch %", lambda r: _q(r).nic_pct(PCIE)),
        ("nic_same_pcie_possible_pct", "…where the node had one %", lambda r: _q(r).nic_possible_pct()),
    ]


def topology_metrics(size: int) -> list[tuple[str, str, Metric]]:
    """(key, column title, per-run value) for the multi-GPU pods of one size."""
    return [
        (f"gpu{size}_arrived", "arrived", lambda r: float(_q(r).arrived.get(size, 0))),
        (f"gpu{size}_placed", "placed", lambda r: float(_q(r).placed(size))),
        (f"gpu{size}_nvlink_pct", "NVLink %", lambda r: _q(r).level_pct(NVLINK, size)),
        (f"gpu{size}_numa_or_better_pct", "≥NUMA %", lambda r: _q(r).level_pct(NUMA, size, or_better=True)),
        (
            f"gpu{size}_nvlink_of_arrived_pct",
            "NVLink/arrived %",
            lambda r: _q(r).arrived_level_pct(NVLINK, size),
        ),
    ]


def metrics() -> list[tuple[str, str, Metric]]:
    """Every reported metric."""
    return packing_metrics() + [m for size in SIZES for m in topology_metrics(size)]


def summary(runs: TraceRuns) -> dict[str, dict[str, dict[str, Any]]]:
    """policy -> metric -> {mean, sd, per_seed}."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for policy, results in runs.runs.items():
        row = {}
        for key, _, fn in metrics():
            values = [fn(r) for r in results]
            mean, sd = mean_sd(values)
            row[key] = {"mean": _num(mean), "sd": _num(sd), "per_seed": [_num(v) for v in values]}
        out[policy] = row
    return out


def _num(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 3)


def _cell(values: Sequence[float], width: int) -> str:
    mean, sd = mean_sd(values)
    return ("—" if math.isnan(mean) else f"{mean:.1f} ± {sd:.1f}").rjust(width)


def _text_table(runs: TraceRuns, title: str, cols: list[tuple[str, str, Metric]]) -> list[str]:
    """Policies x columns; a column equal for every policy (— aside) is said once below instead (in
    the demo every joint GPU+NIC pod requires SamePCIe, so the NIC columns are 100 for every policy)."""
    cells = {
        key: [_cell([fn(r) for r in results], 0).strip() for results in runs.runs.values()]
        for key, _, fn in cols
    }
    measured = {k: {v for v in cells[k] if v != "—"} for k, _, _ in cols}
    same = [(t, *measured[k]) for k, t, _ in cols if len(runs.runs) > 1 and len(measured[k]) == 1]
    shown = [(k, t) for k, t, _ in cols if t not in {name for name, _ in same}]
    widths = [max(len(t), 13) for _, t in shown]
    lines = [
        title,
        f"{'policy':<12}" + "".join(f" {t:>{w}}" for (_, t), w in zip(shown, widths, strict=True)),
    ]
    for i, policy in enumerate(runs.runs):
        row = " ".join(f"{cells[k][i]:>{w}}" for (k, _), w in zip(shown, widths, strict=True))
        lines.append(f"{policy:<12} {row}")
    if same:
        lines.append(
            "the same for every policy that had such pods: " + ", ".join(f"{t} {v}" for t, v in same)
        )
    return lines


def arrived_total(runs: TraceRuns, size: int) -> int:
    """Pods of `size` GPUs that arrived, over all seeds (the same workload for every policy)."""
    first = next(iter(runs.runs.values()), [])
    return sum(_q(r).arrived.get(size, 0) for r in first)


def format_quality_table(runs: TraceRuns) -> str:
    """Policies × metrics, mean ± SD over seeds (— where no run had such a pod): packing, gangs
    and NIC pairing, then one table per multi-GPU pod size with a handful of pods or more."""
    seeds = f"mean ± SD over {len(runs.seeds)} seed(s) {runs.seeds[0]}..{runs.seeds[-1]}"
    lines = _text_table(runs, f"{runs.trace}: packing, gangs, NIC pairing ({seeds})", packing_metrics())
    lines += textwrap.wrap(BEST_LINK, 100)
    for size in SIZES:
        lines.append("")
        arrived = arrived_total(runs, size)
        if arrived < HANDFUL:
            lines.append(
                f"{size}-GPU pods: {arrived} arrived over {len(runs.seeds)} seed(s), too few to compare"
            )
            continue
        lines += _text_table(runs, f"{size}-GPU pods: interconnect of the GPU set", topology_metrics(size))
    return "\n".join(lines)


def _markdown_table(runs: TraceRuns, cols: list[tuple[str, str, Metric]]) -> list[str]:
    lines = [
        "| policy | " + " | ".join(t for _, t, _ in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for policy, results in runs.runs.items():
        cells = [_cell([fn(r) for r in results], 0).strip() for _, _, fn in cols]
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return lines


def format_markdown(runs: TraceRuns) -> str:
    """The same tables as Markdown (for docs/simulator.md)."""
    lines = _markdown_table(runs, packing_metrics())
    for size in SIZES:
        lines += ["", f"{size}-GPU pods:", "", *_markdown_table(runs, topology_metrics(size))]
    return "\n".join(lines)


def measured(runs: TraceRuns) -> bool:
    """Whether any run placed or lost a multi-GPU pod or a joint GPU+NIC pod."""
    return any(_q(r).arrived or sum(_q(r).nic) for results in runs.runs.values() for r in results)


def pooled(results: Sequence[RunResult]) -> QualityStats:
    total = QualityStats()
    for r in results:
        total.merge(_q(r))
    return total


def plot_quality(runs: TraceRuns, out_dir: Path) -> Path:
    """topology-vs-load.png: per policy, the share of the multi-GPU pods that got one NVLink domain,
    by the load when they arrived (arrived GPU demand, % of capacity), pods pooled over seeds.
    The bins hold about equally many arrived pods (the same pods for every policy: the workload is
    the policies' common input), at least 15 each, so no point is a percentage of two pods; each
    bin is one step of the x axis, labelled with the loads it spans and its pod count. Left: of the
    pods placed (their count per policy; a share of fewer than FEW is left out); right: of the pods
    that arrived (a pod never placed counts as not in one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    first = pooled(next(iter(runs.runs.values()), []))
    edges = equal_count_edges([load for load, level in first.arrivals if level != NO_TOPOLOGY], most=8)
    bins = max(0, len(edges) - 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    placed_counts: list[list[int]] = []
    arrived_counts: list[int] = [0] * bins
    policies = len(runs.runs)
    for i, (policy, results) in enumerate(runs.runs.items()):
        stats = pooled(results)
        color = plt.get_cmap("tab10")(i % 10)
        dodge = (i - (policies - 1) / 2) * 0.05  # lines that agree stay visible side by side
        xs = [b + dodge for b in range(bins)]
        for axis, of_arrived in ((left, False), (right, True)):
            shares, counts = binned_share(stats.arrivals, edges, of_arrived=of_arrived) if bins else ([], [])
            # a policy that placed a handful of a bin's pods has no share worth a point there
            shares = [math.nan if n < FEW else v for v, n in zip(shares, counts, strict=True)]
            axis.plot(xs, shares, marker="o", color=color, label=policy)
            if of_arrived:
                arrived_counts = counts
            else:
                placed_counts.append(counts)
    spans = [f"{a:.0f}-{b:.0f}" for a, b in pairwise(edges)]
    for axis, counts in ((left, _ranges(placed_counts)), (right, [str(n) for n in arrived_counts])):
        axis.set_xticks(
            range(bins), [f"{span}\nn={n}" for span, n in zip(spans, counts, strict=True)], fontsize=8
        )
        axis.set_xlim(-0.5, bins - 0.5)
        axis.set_ylim(-3, 103)
        axis.set_xlabel("load when the pod arrived (GPU demand, % of capacity)")
        axis.grid(alpha=0.3)
    left.set_title("placed multi-GPU pods in one NVLink domain (%)")
    right.set_title("arrived multi-GPU pods placed in one NVLink domain (%)")
    left.set_ylabel("% of the bin's pods (n: pods in the bin)")
    right.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle(
        f"{runs.trace}: NVLink vs load, {sum(arrived_counts)} arrived multi-GPU pods "
        f"({len(runs.seeds)} seeds pooled) in {bins} bins of about equal count"
    )
    path = out_dir / "topology-vs-load.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ranges(per_policy: list[list[int]]) -> list[str]:
    """Per bin, the placed pods' count over the policies ("41" or "38-41")."""
    out = []
    for counts in zip(*per_policy, strict=True) if per_policy else ():
        low, high = min(counts), max(counts)
        out.append(str(low) if low == high else f"{low}-{high}")
    return out
