"""The lines printed under a workload's table that say how to read it: why pods fail on purpose
and why fragmentation is above zero on an empty cluster."""

from __future__ import annotations

import statistics
import textwrap

import numpy as np

from simulator.runner import TraceRuns, median_curve


def arrived_at_end(runs: TraceRuns) -> int:
    """The arrived GPU demand, in % of the cluster's GPUs, that the runs reached."""
    reached = []
    for results in runs.runs.values():
        for r in results:
            finite = np.flatnonzero(np.isfinite(r.curves.unallocated))
            if finite.size:
                reached.append(int(finite[-1]))
    return max(reached, default=0)


def caption(runs: TraceRuns, width: int = 100) -> list[str]:
    if not runs.runs:
        return []
    first = next(iter(runs.runs.values()))
    pods = round(statistics.fmean(r.pods for r in first))
    end = arrived_at_end(runs)
    frag0 = float(median_curve(first, "frag_amount")[0])
    lines = []
    if end > 100:
        lines.append(
            f"Pods failed: the workload's GPU demand keeps arriving up to {end}% of the cluster's GPUs, "
            f"so about {100 - 100 * 100 / end:.0f}% of it cannot fit under any policy; the column counts "
            f"the pods (of {pods}, mean over seeds) that found no room. Rank policies by unallocated GPU: "
            "one can fail fewer pods and still strand more GPUs when the pods it fails are the big ones."
        )
    if np.isfinite(frag0) and frag0 > 0:
        lines.append(
            f"Fragmentation (fragmentation.png) starts at {frag0:.1f}% on the empty cluster: FGD's measure "
            "counts an idle GPU as fragmented for each task of the workload's mix that could not use it "
            "on its node (CPU-only tasks, tasks wanting more GPUs than the node has or another GPU model), "
            "weighted by that task's share of the mix."
        )
    return [part for line in lines for part in textwrap.wrap(line, width)]
