"""Allocation quality beside packing: the topology workload (simulator/data/topology-workload.yaml)
on the mixed hw-fixture cluster, every policy, mean ± SD over seeds.

    .venv/bin/python bench/quality.py [--seeds 1-10] [--policies ...] [--json results/quality.json]

Prints the table (unallocated GPU % at 100% arrived, pods failed, gangs never placed, multi-GPU pods
placed and at their node type's best level, NVLink and ≥NUMA shares per pod size, joint NIC
pairing), writes the JSON and out/quality/topology-vs-load.png. `--markdown` prints the table as
Markdown too (docs/simulator.md). Then the same arrivals again with departures and a gang queue
(`--lifetime`, mean lifetime in arrivals; 0 skips it): gang wait p50/p99 and gangs never placed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simulator.gang_wait import format_gang_waits, run_gang_waits
from simulator.nodes import nodes_from_spec
from simulator.protocol import parse_seeds
from simulator.quality_report import (
    QUALITY_POLICIES,
    TOPOLOGY_NODES,
    TOPOLOGY_WORKLOAD,
    format_markdown,
    format_quality_table,
    plot_quality,
    summary,
)
from simulator.runner import run_workload
from simulator.workload import load_workload


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="1-10")
    parser.add_argument("--policies", default=",".join(QUALITY_POLICIES))
    parser.add_argument("--nodes", default=TOPOLOGY_NODES)
    parser.add_argument("--workload", type=Path, default=TOPOLOGY_WORKLOAD)
    parser.add_argument("--json", type=Path, default=Path("results/quality.json"))
    parser.add_argument("--plots", type=Path, default=Path("out/quality"))
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--lifetime", type=float, default=600.0, help="mean pod lifetime for gang wait")
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    started = time.perf_counter()
    workload, node_objects = load_workload(args.workload), nodes_from_spec(args.nodes)
    runs = run_workload(
        workload,
        node_objects,
        policies,
        seeds,
        show_progress=sys.stderr.isatty(),
    )
    print(f"cluster: {args.nodes}")
    print(format_quality_table(runs))
    if args.markdown:
        print()
        print(format_markdown(runs))
    report = {"workload": runs.trace, "nodes": args.nodes, "seeds": seeds, "policies": summary(runs)}
    if args.lifetime > 0:
        waits = run_gang_waits(workload, node_objects, policies, seeds, args.lifetime)
        print()
        print(format_gang_waits(waits, args.lifetime))
        report["gang_wait"] = {
            "mean_lifetime": args.lifetime,
            "policies": {
                p: {"waits": [r.waits for r in rs], "never_placed": [r.never for r in rs]}
                for p, rs in waits.items()
            },
        }
    print(f"{len(policies) * len(seeds)} × 2 runs in {time.perf_counter() - started:.1f} s wall")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {args.json}")
    print(f"plot: {plot_quality(runs, args.plots)}")


if __name__ == "__main__":
    main()
