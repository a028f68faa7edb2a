"""`topoalloc simulate` and `topoalloc demo`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from simulator.engine import POLICIES
from simulator.openb import TraceError, load_expected, resolve_trace, trace_label
from simulator.protocol import parse_seeds
from simulator.runner import REPORT_AT, TraceRuns, run_trace

DEFAULT_POLICIES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "topoalloc")


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


def simulate_paper(
    trace: str,
    seeds: list[int],
    policies: list[str],
    json_out: Path | None,
    plots_dir: Path | None,
    workers: int | None,
    progress: bool,
) -> TraceRuns:
    started = time.perf_counter()
    runs = run_trace(trace, policies, seeds, workers=workers, show_progress=progress)
    click.echo(format_table(runs))
    click.echo(f"{len(policies) * len(seeds)} runs in {time.perf_counter() - started:.1f} s wall")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(runs.to_json(), indent=2) + "\n")
        click.echo(f"results: {json_out}")
    if plots_dir is not None:
        from simulator.plots import plot_runs  # matplotlib loads only when plotting

        for path in plot_runs(runs, plots_dir):
            click.echo(f"plot: {path}")
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
    required=True,
    metavar="TRACE",
    help="openb trace name (default, multigpu50, gpushare40, ...) or a path to a pod CSV.",
)
@click.option("--seeds", default="42-51", show_default=True, help="Seeds, e.g. 42-51 or 42,45.")
@click.option(
    "--policies", default=",".join(DEFAULT_POLICIES), show_default=True, help="Comma-separated policies."
)
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
    help="Folder for the PNG plots (a subfolder per trace).",
)
@click.option("--no-plots", is_flag=True, help="Skip the plots.")
@click.option("--workers", type=click.IntRange(min=1), help="Processes (default: the usable CPUs).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def simulate(
    trace: str,
    seeds: str,
    policies: str,
    json_out: Path | None,
    plots_dir: Path,
    no_plots: bool,
    workers: int | None,
    no_progress: bool,
) -> None:
    """Replay an openb GPU trace by the FGD paper's protocol and compare policies."""
    try:
        seed_list = parse_seeds(seeds)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--seeds") from None
    names = _policies(policies)
    try:
        label = trace_label(resolve_trace(trace))
        out = None if no_plots else plots_dir / label
        simulate_paper(trace, seed_list, names, json_out, out, workers, not no_progress)
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
def demo() -> None:
    """A quick look (placeholder until the embedded main job lands): one seed of the default
    openb trace with BestFit, FGD and topoalloc; plots in out/demo/."""
    try:
        simulate_paper("default", [42], ["bestfit", "fgd", "topoalloc"], None, Path("out/demo"), None, True)
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None
