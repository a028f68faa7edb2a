"""The topology workload (simulator/topology_mix.py): a required leaf keeps every gang and RL job
group inside one leaf, where without levels some straddle; every policy replays the same seeded
workload; the command prints the table and draws the plot."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

from click.testing import CliRunner
from PIL import Image

from simulator.topology_mix import POLICIES, TopologyMixSettings, run_topology_mix, workload
from topoalloc.cli import main

SMALL = TopologyMixSettings(spines=2, leafs=2, nodes=4, days=1.0, load=0.5, gang_every_hours=1.0, seed=4)


def test_required_keeps_one_leaf_and_every_policy_replays_the_same_workload() -> None:
    got = {p: run_topology_mix(SMALL, p) for p in POLICIES}
    assert got["required"].gangs.count > 0 and got["required"].groups.count > 0
    for kind in ("gangs", "groups"):
        required = getattr(got["required"], kind)
        assert required.leafs == required.spines == required.one_leaf == 1.0
    # Every policy replays the same workload: the same gangs arrive.
    arrived = {p: r.gangs.count + r.gangs.waiting for p, r in got.items()}
    assert len(set(arrived.values())) == 1
    assert got["no-profile"].gangs.leafs > 1.0  # without levels some gangs do straddle leafs
    assert run_topology_mix(SMALL, "preferred") == got["preferred"]  # seeded: the same run twice


def test_the_workload_has_batch_pods_gangs_and_job_groups_of_the_stated_shapes() -> None:
    jobs = workload(SMALL, 8 * 12)
    kinds = {j.kind for j in jobs}
    assert kinds == {"batch", "gang", "group"}
    for j in jobs:
        if j.kind == "group":
            assert j.gpus[0] == 1 and set(j.gpus[1:]) == {2} and 3 <= len(j.gpus) - 1 <= 6
        if j.kind == "gang":
            assert (len(j.gpus), j.gpus[0]) in {(2, 4), (4, 4), (8, 4), (4, 2), (8, 2)}
    assert all(a.arrived <= b.arrived for a, b in itertools.pairwise(jobs))


def test_the_command_prints_every_policy_and_writes_the_plot(tmp_path: Path) -> None:
    plot = tmp_path / "spread.png"
    args = ["topology-mix", "--days", "0.25", "--spines", "1", "--leafs", "2", "--nodes", "2"]
    result = CliRunner().invoke(main, [*args, "--no-progress", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines()[1:9]]
    assert [" ".join(r[:3]) for r in rows] == [
        f"{label} {kind}"
        for label in ("no levels", "profile only", "preferred leaf", "required leaf")
        for kind in ("gangs", "groups")
    ]
    for required in rows[6:]:  # placed inside one leaf (nan: none placed in so short a run)
        leafs = float(required[5])
        assert leafs == 1.0 or (math.isnan(leafs) and required[3] == "0")
    assert f"plot: {plot}" in result.output
    with Image.open(plot) as img:
        assert img.size[0] > 1000 and img.size[1] > 400
    bad = CliRunner().invoke(main, ["topology-mix", "--load", "2"])
    assert bad.exit_code != 0 and "--load" in bad.output
