"""The FGD paper protocol on an openb trace: every policy, 10 seeds, unallocated GPU % at 100% arrived.

    .venv/bin/python bench/trace.py [TRACE] [--seeds 42-51] [--json results/trace-TRACE.json]

Prints the table (ours beside the FGD artifact's numbers) and the wall time, and writes the results
JSON ({trace, seeds, policies: {NAME: {mean, sd, per_seed}}}) and the plots under out/sim/TRACE/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simulator.openb import resolve_trace, trace_label
from simulator.protocol import parse_seeds
from topoalloc.commands.simulate import DEFAULT_POLICIES, simulate_paper


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trace", nargs="?", default="default")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workers", type=int)
    args = parser.parse_args()
    label = trace_label(resolve_trace(args.trace))
    json_out = args.json or Path("results") / f"trace-{label}.json"
    simulate_paper(
        args.trace,
        parse_seeds(args.seeds),
        [p.strip() for p in args.policies.split(",") if p.strip()],
        json_out,
        Path("out/sim") / label,
        args.workers,
        sys.stderr.isatty(),
    )


if __name__ == "__main__":
    main()
