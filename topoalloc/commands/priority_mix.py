"""`topoalloc priority-mix`: the timed mixed workload of simulator/priority_mix.py under gang
preemption and without it, as a table."""

from __future__ import annotations

import click
from tqdm import tqdm

from simulator.priority_mix import MixResult, MixSettings, run_mix


def format_mix(results: list[MixResult]) -> str:
    lines = [
        f"{'policy':<14} {'gangs placed':>12} {'gang wait p50 h':>15} {'p99 h':>7} "
        f"{'GPU-h lost':>10} {'victims':>8} {'batch wait p50 h':>16} {'GPU use':>8}"
    ]
    for r in results:
        name = "preemption" if r.preempt else "no preemption"
        lines.append(
            f"{name:<14} {r.gangs_placed:>5} / {r.gangs:<4} {r.gang_wait_p50:>15.2f} {r.gang_wait_p99:>7.2f} "
            f"{r.gpu_hours_lost:>10.1f} {r.victims:>8} {r.batch_wait_p50:>16.2f} {r.gpu_use:>8.1%}"
        )
    return "\n".join(lines)


@click.command("priority-mix")
@click.option("--days", default=7.0, show_default=True, help="Simulated days.")
@click.option("--racks", default=4, show_default=True, help="Racks of 4 DGX H100 nodes.")
@click.option("--load", default=0.85, show_default=True, help="Batch GPU demand as a share of the cluster.")
@click.option("--seed", default=1, show_default=True)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def priority_mix(days: float, racks: int, load: float, seed: int, no_progress: bool) -> None:
    """Gang wait and GPU-hours lost to preemption: low-priority batch pods and high-priority
    8-GPU training gangs, with gang preemption (the allocator's default) and without."""
    if days <= 0 or racks <= 0 or not 0 < load <= 1:
        raise click.BadParameter("--days and --racks must be positive, --load in (0, 1]")
    settings = MixSettings(racks=racks, load=load, days=days, seed=seed)
    results = []
    for preempt in (True, False):
        label = "preemption" if preempt else "no preemption"
        with tqdm(total=100, desc=label, unit="%", disable=no_progress) as bar:

            def tick(share: float, bar: tqdm = bar) -> None:
                bar.update(max(0, int(share * 100) - bar.n))

            results.append(run_mix(settings, preempt=preempt, progress=tick))
    click.echo(format_mix(results))
