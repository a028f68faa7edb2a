"""With and without defragmentation: a workload replayed day after day with departures, every seed
twice on the same arrivals and lifetimes (simulator/defrag_replay.py); the table and the plot of
the largest free block over time (`topoalloc simulate --workload FILE --defrag`).

A day is one stream of the workload (its trace pods shuffled with the day's seed, stretched to
its `fill` of the cluster's GPUs, its jobs at their positions), its pods renamed per day; arrivals
are spread evenly over the 24 hours, so `fill` is the GPU demand that arrives per day and a
lifetime of `mean_hours` keeps about fill × mean_hours / 24 of the GPUs asked for.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from simulator.cluster import SimCluster, SimRequest
from simulator.defrag_replay import HOUR, DefragReplay, DefragRun, DefragSimSettings, lifetimes
from simulator.engine import POLICIES, Arrival
from simulator.gang_planner import Gang
from simulator.nodes import NodeObjects
from simulator.runner import workload_setup
from simulator.workload import Workload, arrivals, target_mix, trace_pods

DAY = 24 * HOUR


@dataclass(frozen=True)
class DefragRuns:
    workload: str
    policy: str
    days: int
    mean_hours: float
    seeds: tuple[int, ...]
    without: tuple[DefragRun, ...]
    with_defrag: tuple[DefragRun, ...]


def _renamed(req: SimRequest, day: int) -> SimRequest:
    key = f"{req.key}-d{day}"
    return replace(req, key=key, gang=f"{req.gang}-d{day}" if req.gang else "", pod=replace(req.pod, key=key))


def day_streams(workload: Workload, capacity_pct: int, seed: int, days: int) -> list[Arrival]:
    """`days` streams of the workload back to back, each pod and gang named for its day."""
    original = trace_pods(workload.trace) if workload.trace is not None else []
    out: list[Arrival] = []
    for day in range(days):
        for item in arrivals(workload, capacity_pct, seed * 1000 + day, original):
            if isinstance(item, Gang):
                out.append(Gang(f"{item.name}-d{day}", tuple(_renamed(m, day) for m in item.members)))
            else:
                out.append(_renamed(item, day))
    return out


def run_defrag(
    workload: Workload,
    node_objects: Sequence[NodeObjects],
    seeds: Sequence[int],
    *,
    days: int = 5,
    mean_hours: float = 18.0,
    policy: str = "topoalloc",
    settings: DefragSimSettings | None = None,
    show_progress: bool = False,
) -> DefragRuns:
    """Every seed without and with defragmentation, on the same arrivals and lifetimes."""
    base = settings or DefragSimSettings()
    original = trace_pods(workload.trace) if workload.trace is not None else []
    mix = target_mix(workload, original)
    capacity = SimCluster(node_objects).capacity_pct
    streams = {seed: day_streams(workload, capacity, seed, days) for seed in seeds}
    total = 2 * sum(len(s) for s in streams.values())
    runs: dict[bool, list[DefragRun]] = {False: [], True: []}
    with tqdm(total=total, desc="simulate defrag", unit="arrival", disable=not show_progress) as bar:
        for seed in seeds:
            stream = streams[seed]
            tick = days * DAY / len(stream)
            for defrag in (False, True):
                cluster = SimCluster(node_objects, tie_seed=seed, metrics_mix=mix)
                chosen = POLICIES[policy](workload_setup(cluster.size, seed), mix)
                s = replace(base, tick_seconds=tick, defrag=defrag)
                replay = DefragReplay(cluster, chosen, s)
                lives = lifetimes(mean_hours, tick, seed)
                runs[defrag].append(replay.run(stream, lives, lambda: bar.update()))
    arms = tuple(runs[False]), tuple(runs[True])
    return DefragRuns(workload.name, policy, days, mean_hours, tuple(seeds), *arms)


# -- the table ---------------------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.1f} ± {sd:.1f}"


def row(runs: Sequence[DefragRun], eight: bool) -> dict[str, str]:
    """One arm's numbers: waits (hours) of waiters placed, seeds pooled; never placed per run;
    the 8-GPU row counts waiters whose every member asks 8 GPUs (a whole DGX node)."""

    def keep(gpus: int) -> bool:
        return gpus >= 8 if eight else True

    waits = [w / HOUR for r in runs for w, g, _ in r.waits if keep(g)]
    never = [float(sum(1 for g, _ in r.never if keep(g))) for r in runs]
    placed = len(waits)
    return {
        "placed": str(placed),
        "waited": str(sum(1 for w in waits if w > 0)),
        "p50": f"{_pct(waits, 50):.2f}",
        "p99": f"{_pct(waits, 99):.2f}",
        "never": _mean_sd(never),
        "block": _mean_sd([statistics.fmean(b for _, b in r.blocks) for r in runs]),
        "moves/h": _mean_sd([r.moves_per_hour for r in runs]),
        "lost": _mean_sd([r.gpu_hours_lost for r in runs]),
    }


HEADERS = (
    ("waiters", "waiters"),
    ("defrag", "defrag"),
    ("placed", "placed"),
    ("waited", "placed after a wait"),
    ("p50", "wait p50 h"),
    ("p99", "wait p99 h"),
    ("never", "never placed / run"),
    ("block", "mean largest free block"),
    ("moves/h", "pods moved / h"),
    ("lost", "GPU-hours lost / run"),
)


def table_rows(result: DefragRuns) -> list[list[str]]:
    out = []
    for eight in (False, True):
        for label, runs in (("off", result.without), ("on", result.with_defrag)):
            r = row(runs, eight)
            out.append(["8-GPU" if eight else "all", label] + [r[k] for k, _ in HEADERS[2:]])
    return out


def format_defrag(result: DefragRuns, *, markdown: bool = False) -> str:
    runs = result.with_defrag
    head = (
        f"defragmentation: {result.workload}, policy {result.policy}, {result.days} days, lifetime "
        f"mean {result.mean_hours:g} h, seeds {','.join(map(str, result.seeds))}; moves "
        f"{sum(r.moves for r in runs)}, held by limits {sum(r.held for r in runs)}, given up "
        f"{sum(r.given_up for r in runs)}, planner passes {sum(r.passes for r in runs)}"
    )
    titles = [t for _, t in HEADERS]
    rows = table_rows(result)
    if markdown:
        lines = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(t), *(len(r[i]) for r in rows)) for i, t in enumerate(titles)]
        lines = ["  ".join(t.ljust(w) for t, w in zip(titles, widths, strict=True))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([head, *lines])


def plot_blocks(result: DefragRuns, out_dir: Path) -> Path:
    """The largest free block over time, without and with defragmentation (median over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    arms = (("without", result.without, "tab:red"), ("with defrag", result.with_defrag, "tab:blue"))
    for label, runs, color in arms:
        length = min(len(r.blocks) for r in runs)
        hours = [h for h, _ in runs[0].blocks[:length]]
        median = np.median([[b for _, b in r.blocks[:length]] for r in runs], axis=0)
        ax.step(hours, median, where="post", label=f"{label} (median of {len(runs)} seeds)", color=color)
    ax.set_xlabel("simulated hours")
    ax.set_ylabel("largest free block (whole GPUs on one node)")
    ax.set_title(f"{result.workload}: largest free block, {result.days} days, policy {result.policy}")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower left")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "defrag-largest-free-block.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
