"""`topoalloc simulate --workload FILE --defrag`: the workload day after day with departures, without
and with defragmentation (simulator/defrag_report.py), the table and the largest-free-block plot."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import click

from simulator.defrag_report import format_defrag, plot_blocks, run_defrag
from simulator.nodes import nodes_from_spec
from simulator.workload import load_workload


def simulate_defrag(
    workload_file: Path,
    nodes: str,
    replicas: int,
    seeds: list[int],
    policies: list[str],
    json_out: Path | None,
    plots_dir: Path | None,
    progress: bool,
    *,
    days: int,
    mean_hours: float,
) -> None:
    started = time.perf_counter()
    workload = load_workload(workload_file)
    node_objects = nodes_from_spec(nodes, replicas)
    click.echo(f"cluster: {len(node_objects)} nodes ({nodes})")
    report = {}
    for policy in policies:
        result = run_defrag(
            workload, node_objects, seeds, days=days, mean_hours=mean_hours, policy=policy,
            show_progress=progress,
        )  # fmt: skip
        click.echo(format_defrag(result))
        if plots_dir is not None:
            click.echo(f"plot: {plot_blocks(result, plots_dir / policy)}")
        report[policy] = {"without": [asdict(r) for r in result.without],
                          "with": [asdict(r) for r in result.with_defrag]}  # fmt: skip
    click.echo(f"{2 * len(policies) * len(seeds)} runs in {time.perf_counter() - started:.1f} s wall")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({"workload": workload.name, "days": days, "mean_hours": mean_hours,
                                        "seeds": seeds, "policies": report}) + "\n")  # fmt: skip
