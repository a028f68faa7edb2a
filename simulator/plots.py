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


def plot_runs(runs: TraceRuns, out_dir: Path, *, paper: bool = True) -> list[Path]:
    """Writes unallocated.png and fragmentation.png (median over seeds; with ``paper``, the FGD
    artifact's medians dashed where it ran the trace). Returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paper_alloc = load_expected_curves(runs.trace, "allo") if paper else {}
    paper_frag = load_expected_curves(runs.trace, "frag") if paper else {}
    paper_ratio = load_expected_curves(runs.trace, "frag_ratio") if paper else {}
    label = f"openb {runs.trace}" if paper else runs.trace
    colors = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(runs.runs)}
    seeds = f"{len(runs.seeds)} seed{'s' if len(runs.seeds) > 1 else ''}"

    fig, ax = plt.subplots(figsize=(8, 5))
    for policy, results in runs.runs.items():
        ax.plot(XS, median_curve(results, "unallocated"), label=policy, color=colors[policy])
        expected = _paper_median(paper_alloc, policy)
        if expected is not None:
            ax.plot(XS, 100 - expected, ls="--", lw=0.9, color=colors[policy], label=f"{policy} (paper)")
    ax.set_xlim(75, 130)
    ax.set_ylim(0, 30)
    ax.axvline(100, color="grey", lw=0.5)
    ax.set_xlabel("arrived workload (% of cluster GPU capacity)")
    ax.set_ylabel("unallocated GPU (%)")
    ax.set_title(f"{label}: unallocated GPU, median of {seeds}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    unalloc_path = out_dir / "unallocated.png"
    fig.tight_layout()
    fig.savefig(unalloc_path, dpi=110)
    plt.close(fig)

    fig, (amount, ratio) = plt.subplots(1, 2, figsize=(12, 4.5))
    for policy, results in runs.runs.items():
        amount.plot(XS, median_curve(results, "frag_amount"), label=policy, color=colors[policy])
        ratio.plot(XS, median_curve(results, "frag_ratio"), label=policy, color=colors[policy])
        for axis, source in ((amount, paper_frag), (ratio, paper_ratio)):
            expected = _paper_median(source, policy)
            if expected is not None:
                axis.plot(XS, expected, ls="--", lw=0.9, color=colors[policy])
    amount.set_ylabel("fragmented GPU (% of capacity)")
    ratio.set_ylabel("fragmented GPU (% of idle GPU)")
    for axis in (amount, ratio):
        axis.set_xlabel("arrived workload (%)")
        axis.set_xlim(0, 130)
        axis.grid(alpha=0.3)
    amount.legend(fontsize=8)
    dashed = " (dashed: paper)" if paper_frag else ""
    fig.suptitle(f"{label}: fragmentation w.r.t. the target workload{dashed}")
    frag_path = out_dir / "fragmentation.png"
    fig.tight_layout()
    fig.savefig(frag_path, dpi=110)
    plt.close(fig)
    return [unalloc_path, frag_path]
