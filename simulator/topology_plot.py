"""The topology workload's plot: leafs spanned per group next to wait, per policy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import matplotlib.pyplot as plt
import numpy as np

from simulator.topology_mix import LABELS, TopologyMixResult


def plot_topology_mix(results: Sequence[TopologyMixResult], path: Path, title: str = "") -> Path:
    """Two panels: mean leafs spanned (gangs, RL job groups) and wait p50/p99 of gangs and groups,
    one group of bars per policy. Returns the path written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    policies = [LABELS[r.policy] for r in results]
    x = np.arange(len(policies))
    fig, (spread, wait) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.38
    for i, (label, values) in enumerate(
        (("gangs", [r.gangs.leafs for r in results]), ("RL job groups", [r.groups.leafs for r in results]))
    ):
        bars = spread.bar(x + (i - 0.5) * width, values, width, label=label)
        spread.bar_label(bars, fmt="%.2f", fontsize=8)
    spread.axhline(1, color="black", lw=0.8, ls=":")
    spread.set_ylabel("leafs spanned per group (mean; 1 = one leaf)")
    spread.set_title("spread")
    width = 0.2
    series = (
        ("gang p50", [r.gangs.wait_p50 for r in results]),
        ("gang p99", [r.gangs.wait_p99 for r in results]),
        ("group p50", [r.groups.wait_p50 for r in results]),
        ("group p99", [r.groups.wait_p99 for r in results]),
    )
    for i, (label, values) in enumerate(series):
        bars = wait.bar(x + (i - 1.5) * width, values, width, label=label)
        wait.bar_label(bars, fmt="%.1f", fontsize=7)
    wait.set_ylabel("wait (hours)")
    wait.set_title("wait")
    for ax in (spread, wait):
        ax.set_xticks(x, policies)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
