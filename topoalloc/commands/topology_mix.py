"""`topoalloc topology-mix`: the topology workload of simulator/topology_mix.py under each policy
(no levels, the detected profile only, a preferred leaf, a required leaf), as a table and a plot."""

from __future__ import annotations

from pathlib import Path

import click
from tqdm import tqdm

from simulator.topology_mix import LABELS, POLICIES, TopologyMixResult, TopologyMixSettings, run_topology_mix


def format_topology_mix(results: list[TopologyMixResult]) -> str:
    head = (
        f"{'policy':<15} {'kind':<6} {'placed':>6} {'waiting':>7} {'leafs':>6} {'spines':>6} "
        f"{'one leaf':>8} {'wait p50 h':>10} {'p99 h':>7}"
    )
    lines = [head]
    for r in results:
        for kind, s in (("gangs", r.gangs), ("groups", r.groups)):
            lines.append(
                f"{LABELS[r.policy]:<15} {kind:<6} {s.count:>6} {s.waiting:>7} {s.leafs:>6.2f} "
                f"{s.spines:>6.2f} {s.one_leaf:>8.0%} {s.wait_p50:>10.2f} {s.wait_p99:>7.2f}"
            )
    use = ", ".join(f"{LABELS[r.policy]} {r.gpu_use:.1%}" for r in results)
    return "\n".join([*lines, f"GPUs busy: {use}"])


@click.command("topology-mix")
@click.option("--days", default=7.0, show_default=True, help="Simulated days.")
@click.option("--spines", default=2, show_default=True, help="Spines.")
@click.option("--leafs", default=8, show_default=True, help="Leafs per spine.")
@click.option("--nodes", default=4, show_default=True, help="DGX H100 nodes per leaf.")
@click.option("--load", default=0.55, show_default=True, help="Batch GPU demand as a share of the cluster.")
@click.option("--gang-every", default=1.0, show_default=True, help="Hours between training gangs (mean).")
@click.option("--seed", default=1, show_default=True, help="Random seed of the workload.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("topology-mix.png"),
    show_default=True,
    help="Where to write the plot.",
)
@click.option("--no-plot", is_flag=True, help="Only the table.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def topology_mix(
    days: float,
    spines: int,
    leafs: int,
    nodes: int,
    load: float,
    gang_every: float,
    seed: int,
    plot_path: Path,
    no_plot: bool,
    no_progress: bool,
) -> None:
    """Leafs spanned and wait of gangs and RL job groups with no topology levels, the detected
    profile only, a preferred leaf and a required leaf: what keeping a job in one leaf costs."""
    if days <= 0 or min(spines, leafs, nodes) <= 0 or gang_every <= 0 or not 0 < load <= 1:
        raise click.BadParameter(
            "--days, --spines, --leafs, --nodes, --gang-every must be positive, --load in (0, 1]"
        )
    settings = TopologyMixSettings(
        spines=spines, leafs=leafs, nodes=nodes, load=load, gang_every_hours=gang_every, days=days, seed=seed
    )
    results = []
    for policy in POLICIES:
        with tqdm(total=100, desc=LABELS[policy], unit="%", disable=no_progress) as bar:

            def tick(share: float, bar: tqdm = bar) -> None:
                bar.update(max(0, int(share * 100) - bar.n))

            results.append(run_topology_mix(settings, policy, tick))
    click.echo(format_topology_mix(results))
    if not no_plot:
        from simulator.topology_plot import plot_topology_mix

        title = (
            f"{spines} spines x {leafs} leafs x {nodes} DGX H100, batch load {load:.0%}, "
            f"a gang every {gang_every:g} h, {days:g} days, seed {seed}"
        )
        click.echo(f"plot: {plot_topology_mix(results, plot_path, title)}")
