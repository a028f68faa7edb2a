"""PNG plots of a run: unallocated GPU % and fragmentation against arrived workload."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import matplotlib.pyplot as plt
import numpy as np

from simulator.metrics import XS
from simulator.openb import load_expected_curves
from simulator.runner import TraceRuns, median_curve


def _paper_median(curves: dict[str, list[list[float]]], policy: str) -> np.ndarray | None:
    rows = curves.get(policy)
    return np.nanmedian(np.array(rows), axis=0) if rows else None


# Lines that stay apart when curves lie on top of each other: colour, dash pattern and marker.
_DASHES = ["-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (3, 1, 1, 1, 1, 1))]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
CAPACITY_LABEL = "100%: arrived demand = the cluster's GPUs"


def _styles(policies: list[str]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for i, policy in enumerate(policies):
        ours = policy == "topoalloc"
        out[policy] = {
            "color": plt.get_cmap("tab10")(i % 10),
            "ls": "-" if ours else _DASHES[i % len(_DASHES)],
            "marker": _MARKERS[i % len(_MARKERS)],
            "markevery": (i * 2, 10),
            "markersize": 4,
            "lw": 2.2 if ours else 1.3,
            "zorder": 3 if ours else 2,
        }
    return out


def _capacity_line(ax: plt.Axes) -> None:
    ax.axvline(100, color="black", lw=0.8, ls=(0, (1, 2)), label=CAPACITY_LABEL)


def plot_runs(runs: TraceRuns, out_dir: Path, *, paper: bool = True) -> list[Path]:
    """Writes unallocated.png and fragmentation.png (median over seeds; with ``paper``, the FGD
    artifact's medians dashed where it ran the trace). Returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paper_alloc = load_expected_curves(runs.trace, "allo") if paper else {}
    paper_frag = load_expected_curves(runs.trace, "frag") if paper else {}
    paper_ratio = load_expected_curves(runs.trace, "frag_ratio") if paper else {}
    label = f"openb {runs.trace}" if paper else runs.trace
    styles = _styles(list(runs.runs))
    seeds = f"{len(runs.seeds)} seed{'s' if len(runs.seeds) > 1 else ''}"

    # Unallocated GPU: the whole range, and beside it a zoom on the saturated end, where the
    # policies differ by tenths of a percent and would otherwise be drawn on top of each other.
    fig, (full, zoom) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    tail = XS >= 100
    tail_values = []
    for policy, results in runs.runs.items():
        curve = median_curve(results, "unallocated")
        tail_values.append(curve[tail])
        for axis in (full, zoom):
            axis.plot(XS, curve, label=policy, **styles[policy])  # type: ignore[arg-type]
        expected = _paper_median(paper_alloc, policy)
        if expected is not None:
            for axis in (full, zoom):
                axis.plot(XS, 100 - expected, ls="--", lw=0.8, color=styles[policy]["color"], alpha=0.6)
    full.set_xlim(75, 130)
    full.set_ylim(0, 30)
    zoom.set_xlim(100, 130)
    finite = np.concatenate(tail_values) if tail_values else np.array([])
    finite = finite[np.isfinite(finite)]
    if finite.size:
        zoom.set_ylim(max(0.0, float(finite.min()) - 0.5), float(finite.max()) + 0.5)
    for axis in (full, zoom):
        _capacity_line(axis)
        axis.set_xlabel("arrived GPU demand (% of the cluster's GPUs)")
        axis.grid(alpha=0.3)
    full.set_ylabel("unallocated GPU (% of the cluster's GPUs)")
    zoom.set_ylabel("unallocated GPU (%)")
    full.set_title("75-130% arrived")
    zoom.set_title("zoom: after 100% arrived (lower is better)")
    dashed = "; thin dashed: the FGD paper's artifact" if paper_alloc else ""
    fig.suptitle(f"{label}: unallocated GPU, median of {seeds}{dashed}")
    handles, labels = full.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 7), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    unalloc_path = out_dir / "unallocated.png"
    fig.savefig(unalloc_path, dpi=110)
    plt.close(fig)

    fig, (amount, ratio) = plt.subplots(1, 2, figsize=(13, 5))
    for policy, results in runs.runs.items():
        amount.plot(XS, median_curve(results, "frag_amount"), label=policy, **styles[policy])  # type: ignore[arg-type]
        ratio.plot(XS, median_curve(results, "frag_ratio"), label=policy, **styles[policy])  # type: ignore[arg-type]
        for axis, source in ((amount, paper_frag), (ratio, paper_ratio)):
            expected = _paper_median(source, policy)
            if expected is not None:
                axis.plot(XS, expected, ls="--", lw=0.8, color=styles[policy]["color"], alpha=0.6)
    amount.set_ylabel("fragmented GPU (% of the cluster's GPUs)")
    ratio.set_ylabel("fragmented GPU (% of the idle GPUs)")
    amount.set_title("share of all GPUs (> 0 when empty: tasks of the mix that a node cannot serve)")
    ratio.set_title("share of the idle GPUs")
    amount.set_ylim(bottom=0)
    ratio.set_ylim(0, 102)
    for axis in (amount, ratio):
        _capacity_line(axis)
        axis.set_xlabel("arrived GPU demand (% of the cluster's GPUs)")
        axis.set_xlim(0, 130)
        axis.grid(alpha=0.3)
    dashed = "; thin dashed: the FGD paper's artifact" if paper_frag else ""
    fig.suptitle(f"{label}: fragmentation against the workload's task mix, median of {seeds}{dashed}")
    handles, labels = amount.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 7), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    frag_path = out_dir / "fragmentation.png"
    fig.savefig(frag_path, dpi=110)
    plt.close(fig)
    return [unalloc_path, frag_path]
