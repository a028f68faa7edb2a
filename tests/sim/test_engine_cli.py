"""End to end on a small pod CSV over the real 1,213-node openb cluster."""

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from simulator.engine import OpenbRequests, openb_cluster, replay
from simulator.openb import OpenbNode, OpenbPod
from simulator.policies import BestFitPolicy
from tests.apis.paths import require_shared
from topoalloc.cli import main


def test_replay_drops_pods_that_fit_nowhere_and_logs_every_event(rng) -> None:
    nodes = [OpenbNode("n", 8000, 1000, 1, "M")]
    pods = [OpenbPod("a", 1000, 0, 1, 600), OpenbPod("b", 1000, 0, 1, 600), OpenbPod("c", 1000, 0, 1, 400)]
    to_request = OpenbRequests()
    log, stats = replay(openb_cluster(nodes), [to_request(p) for p in pods], BestFitPolicy([0], rng))
    assert (stats.pods, stats.failed) == (3, 1)
    assert log.arrived.tolist() == [60, 120, 160]
    assert log.allocated.tolist() == [60, 60, 100]


def small_trace(tmp_path: Path) -> Path:
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli"]
    shapes = [(4000, 1, 500), (8000, 1, 1000), (2000, 0, 0), (16000, 8, 1000), (3000, 1, 250)]
    for i in range(200):
        cpu, n, milli = shapes[i % len(shapes)]
        rows.append(f"p{i:03d},{cpu},1024,{n},{milli}")
    path = tmp_path / "small.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def small_cluster(tmp_path: Path) -> Path:
    rows = ["sn,cpu_milli,memory_mib,gpu,model"]
    rows += [f"node-{i:02d},96000,262144,{(4, 8, 8)[i % 3]},{('T4', 'G2')[i % 2]}" for i in range(40)]
    path = tmp_path / "nodes.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_simulate_writes_the_json_schema_and_plots(tmp_path: Path) -> None:
    require_shared()
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        main,
        [
            "simulate",
            "--paper",
            str(small_trace(tmp_path)),
            "--nodes",
            str(small_cluster(tmp_path)),
            "--seeds",
            "1-2",
            "--policies",
            "bestfit,topoalloc",
            "--json",
            str(out),
            "--plots",
            str(tmp_path / "plots"),
            "--workers",
            "1",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "bestfit" in result.output and "topoalloc" in result.output and "nodes.csv" in result.output
    data = json.loads(out.read_text())
    assert data["trace"] == "small" and data["seeds"] == [1, 2]
    for name in ("bestfit", "topoalloc"):
        entry = data["policies"][name]
        assert set(entry) == {"mean", "sd", "per_seed"} and len(entry["per_seed"]) == 2
        assert np.isclose(entry["mean"], np.mean(entry["per_seed"]), atol=1e-3)
        assert 0 <= entry["mean"] <= 100
    for png in ("unallocated.png", "fragmentation.png"):
        assert (tmp_path / "plots" / "small" / png).read_bytes().startswith(b"\x89PNG")


def test_simulate_rejects_unknown_policy_and_trace(tmp_path: Path) -> None:
    require_shared()
    bad = CliRunner().invoke(main, ["simulate", "--paper", "default", "--policies", "nope"])
    assert bad.exit_code == 2 and "unknown policy nope" in bad.output
    missing = CliRunner().invoke(main, ["simulate", "--paper", "nosuchtrace", "--no-progress"])
    assert missing.exit_code == 2 and "unknown trace" in missing.stderr  # bad input (issue 18)
