"""Parameters of the production fragmentation scorer on the FGD paper protocol.

    .venv/bin/python bench/fgd_variants.py [TRACE] [--seeds 42-51] [--variants base,h16,step4,...]

Each variant is the production `topoalloc` policy (the core's NodeScorer and ClusterState, as
`topoalloc simulate` runs it) with one of its constants changed for that run: the hole horizon
(`fragmentation.HORIZON`), the node-cost step (`NODE_STEP_PCT`), the model-pressure rounding
(`fragmentation_term.PRESSURE_LEVELS`), the CPU budget's step (`CPU_BUDGET_STEP_MILLI`; `nobudget`
leaves the budget out), the component weights or the mix's settings. Prints
unallocated GPU % at 100% arrived, mean ± SD over the seeds, and the per-seed values. Two worker
processes. Compare means over 10 seeds; single seeds differ by more than most of these changes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import allocator.core.scoring.fragmentation as frag
import allocator.core.scoring.fragmentation_term as term
from allocator.core.scoring.scorer import ScoringConfig
from simulator.engine import POLICIES, PolicyFactory, RunSetup
from simulator.policies import TopoallocPolicy
from simulator.protocol import parse_seeds
from simulator.runner import run_trace

FRAGMENTATION_ONLY = {"fit": 0, "scarce": 0, "topology": 0, "fragmentation": 1}
BASE: dict[str, Any] = {
    "horizon": frag.HORIZON,
    "step": frag.NODE_STEP_PCT,
    "levels": term.PRESSURE_LEVELS,
    "weights": None,
    "fragmentation": None,
    "arrivals": False,
    "pressure": True,
    "cpu_budget": frag.CPU_BUDGET_STEP_MILLI,
    "budget": True,
}
VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "h8": {"horizon": 8},
    "h16": {"horizon": 16},
    "h20": {"horizon": 20},
    "h28": {"horizon": 28},
    "h32": {"horizon": 32},
    "h64": {"horizon": 64},
    "step2": {"step": 2.0},
    "step4": {"step": 4.0},
    "step7": {"step": 7.0},
    "step10": {"step": 10.0},
    "levels2": {"levels": 2},
    "levels4": {"levels": 4},
    "levels10": {"levels": 10},
    "levels50": {"levels": 50},
    "levels1000": {"levels": 1000},
    "frag-only": {"weights": FRAGMENTATION_ONLY},
    "cov1": {"fragmentation": {"coverage": 1.0}},
    "cov90": {"fragmentation": {"coverage": 0.9}},
    "window2000": {"fragmentation": {"window": 2000}},
    "window500": {"fragmentation": {"window": 500}},
    "refresh50": {"fragmentation": {"refreshEvery": 50}},
    "tol0": {"fragmentation": {"tolerance": 0.0}},
    "tol02": {"fragmentation": {"tolerance": 0.02}},
    "tol05": {"fragmentation": {"tolerance": 0.05}},
    "tol10": {"fragmentation": {"tolerance": 0.10}},
    "budget1000": {"cpu_budget": 1000},
    "nobudget": {"budget": False},
    "budget4000": {"cpu_budget": 4000},
    "arrivals": {"arrivals": True},
    "nopressure": {"pressure": False},
}


class LearnFromArrivals(TopoallocPolicy):
    """The mix learns every arriving pod (before it is placed, and also when it is rejected)
    instead of the placed ones only."""

    def attach(self, cluster: Any) -> None:
        # Not TopoallocPolicy.attach: the scorer does not observe placements.
        feasible = cluster.feasible

        def observed(req: Any) -> Any:  # replay asks every arriving pod's feasible nodes first
            self.scorer.observe(req.pod)
            return feasible(req)

        cluster.feasible = observed


PRESSURE_OF = term.FragmentationTerm._pressure_of
CPU_STARVED = frag.cpu_starved


def _no_pressure(_term: Any, _state: Any) -> float:
    return 0.0


def factory(options: dict[str, Any]) -> PolicyFactory:
    """Sets the constants in the worker process that runs the policy (one run at a time)."""

    def make(setup: RunSetup, _mix: Any) -> TopoallocPolicy:
        o = {**BASE, **options}
        frag.score_node.__kwdefaults__["horizon"] = o["horizon"]
        frag.NODE_STEP_PCT = o["step"]
        term.PRESSURE_LEVELS = o["levels"]
        frag.CPU_BUDGET_STEP_MILLI = o["cpu_budget"]
        frag.cpu_starved = CPU_STARVED if o["budget"] else lambda *_args: 0.0
        # without pressure every node sees 0; set on every run, as a worker runs several variants
        term.FragmentationTerm._pressure_of = PRESSURE_OF if o["pressure"] else _no_pressure  # type: ignore[method-assign]
        config = ScoringConfig.from_dict({k: o[k] for k in ("weights", "fragmentation") if o[k] is not None})
        kind = LearnFromArrivals if o["arrivals"] else TopoallocPolicy
        return kind(setup.node_rank, setup.rng, config)

    return make


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trace", nargs="?", default="default")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--variants", default="base", help=f"comma-separated: {', '.join(VARIANTS)}")
    args = parser.parse_args()
    names = args.variants.split(",")
    for name in names:
        if name not in VARIANTS:
            parser.error(f"unknown variant {name!r}")
        POLICIES[f"v-{name}"] = factory(VARIANTS[name])  # forked workers inherit the registry
    runs = run_trace(args.trace, [f"v-{n}" for n in names], parse_seeds(args.seeds), workers=2)
    print(f"{'variant':12s} unallocated % at 100% arrived (mean ± SD)  per seed")
    for name in names:
        mean, sd = runs.mean_sd(f"v-{name}")
        per_seed = ", ".join(f"{v:.2f}" for v in runs.per_seed(f"v-{name}"))
        print(f"{name:12s} {mean:.2f} ± {sd:.2f}  [{per_seed}]")


if __name__ == "__main__":
    main()
