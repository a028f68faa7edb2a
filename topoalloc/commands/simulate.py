"""`topoalloc simulate` (the paper protocol on an openb trace, or a workload of jobs and gangs on a
chosen cluster) and `topoalloc demo` (the main job of `make run`)."""

from __future__ import annotations

import json
import statistics
import textwrap
import time
from pathlib import Path

import click

import simulator
from simulator.engine import POLICIES
from simulator.nodes import nodes_from_spec
from simulator.openb import TraceError, load_expected, resolve_trace, trace_label
from simulator.protocol import parse_seeds
from simulator.quality_report import format_quality_table, measured, plot_quality
from simulator.runner import REPORT_AT, TraceRuns, mean_sd, run_trace, run_workload
from simulator.workload import load_workload
from topoalloc.errors import BadInput

DEFAULT_POLICIES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "topoalloc")
WORKLOAD_POLICIES = ("random", "dotprod", "gpupacking", "bestfit", "fgd", "koordinator", "topoalloc")

# The demo: a few dozen replicas of the hw-fixture machines (36 nodes, 180 GPUs).
DEMO_NODES = (
    "hw-fixtures:dgx-h100=6,l40s-8x-pcie=8,a100-pcie-4x-no-rdma=8,"
    "l20-4x-vm-numa-unknown=6,rtx-a6000-nvlink-bridge=4,cpu-only=4"
)
DEMO_WORKLOAD = Path(simulator.__file__).resolve().parent / "data" / "demo-workload.yaml"
DEMO_OUT = Path("out/demo")
DEMO_SEEDS = "1-10"


def format_table(runs: TraceRuns, arrived: int = REPORT_AT) -> str:
    """Mean ± SD of unallocated GPU % per policy beside the FGD artifact's numbers."""
    expected = load_expected(runs.trace)
    lines = [
        f"openb {runs.trace}: unallocated GPU % at {arrived}% arrived, {len(runs.seeds)} seed(s) "
        f"{runs.seeds[0]}..{runs.seeds[-1]}",
        f"{'policy':<14} {'ours':>15} {'paper (FGD artifact)':>22} {'diff':>7}  {'s/run':>6}",
    ]
    for policy, results in runs.runs.items():
        mean, sd = runs.mean_sd(policy, arrived)
        point = expected.get(policy, {}).get(arrived)
        paper = f"{point.mean:6.2f} ± {point.sd:4.2f}" if point else "—"
        diff = f"{mean - point.mean:+6.2f}" if point else ""
        secs = sum(r.seconds for r in results) / len(results)
        lines.append(f"{policy:<14} {mean:8.2f} ± {sd:4.2f} {paper:>22} {diff:>7}  {secs:6.1f}")
    return "\n".join(lines)


def format_workload_table(runs: TraceRuns, arrived: int = REPORT_AT) -> str:
    """Per policy: unallocated GPU % at ``arrived`` % and after the last pod, pods and gangs that
    could not be placed (means over seeds)."""
    lines = [
        f"{runs.trace}: unallocated GPU % (mean ± SD over {len(runs.seeds)} seed(s) "
        f"{runs.seeds[0]}..{runs.seeds[-1]}), lower is better",
        f"{'policy':<12} {f'at {arrived}% arrived':>17} {'at the end':>14} {'pods failed':>12} "
        f"{'gangs placed':>13} {'s/run':>6}",
    ]
    for policy, results in runs.runs.items():
        mean, sd = runs.mean_sd(policy, arrived)
        end_mean, end_sd = mean_sd([r.final_unallocated for r in results])
        failed = statistics.fmean(r.failed for r in results)
        pods = round(statistics.fmean(r.pods for r in results))
        gangs = statistics.fmean(r.gangs - r.failed_gangs for r in results)
        total = results[0].gangs
        secs = sum(r.seconds for r in results) / len(results)
        lines.append(
            f"{policy:<12} {mean:10.2f} ± {sd:4.2f} {end_mean:7.2f} ± {end_sd:4.2f} "
            f"{failed:6.1f} / {pods:<4} {gangs:7.1f} / {total:<3} {secs:6.2f}"
        )
    from simulator.caption import caption

    return "\n".join(lines + caption(runs))


def format_demo_summary(runs: TraceRuns, arrived: int = REPORT_AT) -> str:
    """The demo's ten-second table: per policy the GPUs left idle when the demand equals the
    cluster, the pods and gangs placed, and how many multi-GPU pods got one NVLink domain."""
    from simulator.caption import arrived_at_end
    from simulator.quality import NVLINK
    from simulator.quality_report import HANDFUL, SIZES, arrived_total, pooled

    sizes = [size for size in SIZES if arrived_total(runs, size) >= HANDFUL]
    first = next(iter(runs.runs.values()))
    pods = round(statistics.fmean(r.pods for r in first))
    gangs = first[0].gangs
    head = (
        "policy",
        f"idle GPU at {arrived}% demand",
        "pods not placed",
        "gangs placed",
        "multi-GPU on NVLink",
    )
    lines = [f"{head[0]:<12} {head[1]:>24} {head[2]:>16} {head[3]:>13} {head[4]:>20}"]
    for policy, results in runs.runs.items():
        mean, sd = runs.mean_sd(policy, arrived)
        failed = statistics.fmean(r.failed for r in results)
        placed = statistics.fmean(r.gangs - r.failed_gangs for r in results)
        stats = pooled(results)
        on_nvlink = sum(stats.multi.get(size, [0] * (NVLINK + 1))[NVLINK] for size in sizes)
        multi = sum(stats.placed(size) for size in sizes)
        nvlink = f"{100 * on_nvlink / multi:.0f}%" if multi else "—"
        lines.append(
            f"{policy:<12} {f'{mean:.1f}% ± {sd:.1f}':>24} {f'{failed:.0f} of {pods}':>16} "
            f"{f'{placed:.1f} of {gangs}':>13} {nvlink:>20}"
        )
    notes = [
        f"Lower idle GPU is better. Demand keeps arriving up to {arrived_at_end(runs)}% of the GPUs, so "
        "some pods fit under no policy; a policy can place more pods and still strand more GPUs."
    ]
    if sizes:
        notes.append(
            f"Multi-GPU on NVLink: the placed {'- and '.join(str(s) for s in sizes)}-GPU pods whose GPUs "
            f"share one NVLink domain, over {len(runs.seeds)} seeds; -v's \"on node's best link\" counts "
            "a pod whose GPUs share the best link its node has (PCIe on an L40S) as well, so it is higher."
        )
    notes.append("The full tables (fragmentation, interconnect per pod size, NIC pairing): topoalloc demo -v")
    return "\n".join(lines + [part for note in notes for part in textwrap.wrap(note, 100)])


def write_outputs(runs: TraceRuns, json_out: Path | None, plots_dir: Path | None, *, paper: bool) -> None:
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(runs.to_json(), indent=2) + "\n")
        click.echo(f"results: {json_out}")
    if plots_dir is not None:
        from simulator.plots import plot_runs  # matplotlib loads only when plotting

        for path in plot_runs(runs, plots_dir, paper=paper):
            click.echo(f"plot: {path}")


def simulate_workload(
    workload_file: Path,
    nodes: str,
    replicas: int,
    seeds: list[int],
    policies: list[str],
    json_out: Path | None,
    plots_dir: Path | None,
    progress: bool,
    *,
    short: bool = False,
    lifetime: float = 600.0,
    tick_seconds: float = 60.0,
) -> TraceRuns:
    """Replay, then print the full tables (or, `short`, the demo's summary) and write the plots."""
    started = time.perf_counter()
    workload = load_workload(workload_file)
    node_objects = nodes_from_spec(nodes, replicas)
    runs = run_workload(workload, node_objects, policies, seeds, show_progress=progress)
    gpus = sum(
        1
        for _, dev in node_objects
        for d in (dev or {}).get("spec", {}).get("devices", [])
        if d["type"] == "gpu"
    )
    quality = measured(runs)
    if short:
        click.echo(
            f"cluster: {len(node_objects)} nodes, {gpus} GPUs; {len(seeds)} seeds of {workload_file.stem}"
        )
        click.echo(format_demo_summary(runs))
    else:
        click.echo(f"cluster: {len(node_objects)} nodes ({nodes}), {gpus} GPUs")
        click.echo(format_workload_table(runs))
        if quality:
            click.echo()
            click.echo(format_quality_table(runs))
    click.echo(f"{len(policies) * len(seeds)} runs in {time.perf_counter() - started:.1f} s wall")
    write_outputs(runs, json_out, plots_dir, paper=False)
    if plots_dir is not None and quality:
        click.echo(f"plot: {plot_quality(runs, plots_dir)}")
    if not short and any(job.reserve_ahead for job in workload.jobs):
        from simulator.reservations import format_reservations, run_reservations

        reserved = run_reservations(workload, node_objects, policies, seeds, lifetime)
        click.echo()
        click.echo(format_reservations(reserved, lifetime, tick_seconds))
    return runs


def simulate_paper(
    trace: str,
    seeds: list[int],
    policies: list[str],
    json_out: Path | None,
    plots_dir: Path | None,
    workers: int | None,
    progress: bool,
    nodes_path: Path | None = None,
) -> TraceRuns:
    started = time.perf_counter()
    runs = run_trace(trace, policies, seeds, workers=workers, show_progress=progress, nodes_path=nodes_path)
    if nodes_path is not None:
        click.echo(f"cluster: {nodes_path} (the paper's numbers are for its 1,213 openb nodes)")
    click.echo(format_table(runs))
    click.echo(f"{len(policies) * len(seeds)} runs in {time.perf_counter() - started:.1f} s wall")
    write_outputs(runs, json_out, plots_dir, paper=True)
    return runs


def _policies(text: str) -> list[str]:
    names = [p.strip().lower() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        raise click.BadParameter(
            f"unknown policy {', '.join(unknown) or '(none)'}; known: {', '.join(POLICIES)}"
        )
    return names


@click.command()
@click.option(
    "--paper",
    "trace",
    metavar="TRACE",
    help="FGD paper protocol on an openb trace: a name (default, multigpu50, gpushare40, ...) or a pod CSV.",
)
@click.option(
    "--workload",
    "workload_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="A YAML workload of jobs and gangs (optionally mixed with openb pods); see simulator/workload.py.",
)
@click.option(
    "--nodes",
    help="With --workload: hw-fixtures (default), hw-fixtures:NAME=COUNT,..., openb, or a node CSV. "
    "With --paper: a node CSV instead of the paper's 1,213 openb nodes.",
)
@click.option("--replicas", default=4, show_default=True, help="Nodes per fixture for --nodes hw-fixtures.")
@click.option("--seeds", default="42-51", show_default=True, help="Seeds, e.g. 42-51 or 42,45.")
@click.option("--policies", help=f"Comma-separated policies (default: {', '.join(DEFAULT_POLICIES)}).")
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write {trace, seeds, policies: {NAME: {mean, sd, per_seed}}} (unallocated GPU % at 100%).",
)
@click.option(
    "--plots",
    "plots_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("out/sim"),
    show_default=True,
    help="Folder for the PNG plots (a subfolder per trace or workload).",
)
@click.option("--no-plots", is_flag=True, help="Skip the plots.")
@click.option(
    "--workers", type=click.IntRange(min=1), help="Processes for --paper (default: the usable CPUs)."
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option(
    "--lifetime",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="With --workload jobs that reserveAhead: mean pod lifetime in arrivals for the reservation replay.",
)
@click.option(
    "--tick-seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Seconds between arrivals, for the GPU-hours reservations idle.",
)
@click.option(
    "--defrag",
    is_flag=True,
    help="With --workload: replay it day after day with departures, without and with defragmentation "
    "(gang wait, gangs never placed, largest free block, pods moved, GPU-hours lost).",
)
@click.option("--days", type=click.IntRange(min=1), default=5, show_default=True, help="With --defrag: days.")
@click.option(
    "--mean-hours",
    type=click.FloatRange(min=0, min_open=True),
    default=18.0,
    show_default=True,
    help="With --defrag: mean pod lifetime in hours (a day's stream arrives over 24 h).",
)
def simulate(
    trace: str | None,
    workload_file: Path | None,
    nodes: str | None,
    replicas: int,
    seeds: str,
    policies: str | None,
    json_out: Path | None,
    plots_dir: Path,
    no_plots: bool,
    workers: int | None,
    no_progress: bool,
    lifetime: float,
    tick_seconds: float,
    defrag: bool,
    days: int,
    mean_hours: float,
) -> None:
    """Replay pods through the production allocator core and compare placement policies.

    --paper TRACE: the FGD paper's protocol on an openb trace (1,213 nodes, inflated to 130%,
    unallocated GPU % at 100% arrived beside the paper's numbers). --workload FILE: jobs and gangs
    (all or nothing) on a cluster from --nodes.
    """
    if (trace is None) == (workload_file is None):
        raise click.UsageError("give exactly one of --paper TRACE or --workload FILE")
    try:
        seed_list = parse_seeds(seeds)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--seeds") from None
    if defrag and workload_file is None:
        raise click.UsageError("--defrag replays a --workload FILE")
    default = DEFAULT_POLICIES if trace is not None else WORKLOAD_POLICIES
    if defrag:
        default = ("topoalloc",)
    names = _policies(policies or ",".join(default))
    try:
        if trace is not None:
            label = trace_label(resolve_trace(trace))
            out = None if no_plots else plots_dir / label
            nodes_path = None if nodes in (None, "openb") else Path(nodes)
            if nodes_path is not None and not nodes_path.is_file():
                raise click.BadParameter("with --paper, give a node CSV", param_hint="--nodes")
            simulate_paper(trace, seed_list, names, json_out, out, workers, not no_progress, nodes_path)
        else:
            assert workload_file is not None
            out = None if no_plots else plots_dir / workload_file.stem
            nodes = nodes or "hw-fixtures"
            if defrag:
                from topoalloc.commands.simulate_defrag import simulate_defrag

                simulate_defrag(
                    workload_file, nodes, replicas, seed_list, names, json_out, out, not no_progress,
                    days=days, mean_hours=mean_hours,
                )  # fmt: skip
                return
            simulate_workload(
                workload_file, nodes, replicas, seed_list, names, json_out, out, not no_progress,
                lifetime=lifetime, tick_seconds=tick_seconds,
            )  # fmt: skip
    except TraceError as exc:
        raise BadInput(str(exc)) from None


@click.command()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEMO_OUT,
    show_default=True,
    help="Folder for unallocated.png, fragmentation.png and topology-vs-load.png.",
)
@click.option("--seeds", default=DEMO_SEEDS, show_default=True, help="Seeds, e.g. 1-5.")
@click.option(
    "--policies",
    default=",".join(WORKLOAD_POLICIES),
    show_default=True,
    help="Comma-separated policies to compare.",
)
@click.option(
    "--nodes", default=DEMO_NODES, show_default=True, help="The demo cluster (see simulate --nodes)."
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option(
    "-v", "--verbose", is_flag=True, help="The full tables: fragmentation, interconnect per size, NICs."
)
def demo(out_dir: Path, seeds: str, policies: str, nodes: str, no_progress: bool, verbose: bool) -> None:
    """The main job of `make run`: a sample of Alibaba's openb GPU trace plus training gangs and an
    inference fleet on a mixed cluster of real machines (hw-fixtures: DGX H100, L40S, A100, L20,
    RTX A6000, CPU-only), placed by each policy through the production allocator core. Prints a
    short table (-v: the full ones) and writes three plots to --out."""
    try:
        seed_list = parse_seeds(seeds)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--seeds") from None
    try:
        simulate_workload(
            DEMO_WORKLOAD,
            nodes,
            0,
            seed_list,
            _policies(policies),
            None,
            out_dir,
            not no_progress,
            short=not verbose,
        )
    except TraceError as exc:
        raise BadInput(str(exc)) from None
