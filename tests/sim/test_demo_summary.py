"""`make run` reads in ten seconds (issue 31): a short table by default, the full ones with -v, no
percentage from a handful of pods, no column that is the same for every policy, and the plots it
writes named in README as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from topoalloc.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("demo")
    runs = {}
    for name, extra in (("short", []), ("full", ["-v"])):
        ran = CliRunner().invoke(main, ["demo", "--seeds", "1-3", "--out", str(out), "--no-progress", *extra])
        assert ran.exit_code == 0, ran.output
        runs[name] = ran.stdout
    runs["plots"] = " ".join(sorted(p.name for p in out.glob("*.png")))
    return runs


def test_the_default_table_is_short_and_plain(outputs: dict[str, str]) -> None:
    lines = outputs["short"].splitlines()
    table = [line for line in lines if not line.startswith(("plot: ", "cluster: ")) and "runs in" not in line]
    assert len(table) <= 14 and max(len(line) for line in table) <= 100, table
    header = table[0]
    for column in ("idle GPU at 100% demand", "pods not placed", "gangs placed", "multi-GPU on NVLink"):
        assert column in header
    assert "multi at best" not in outputs["short"] and "NIC" not in header
    rows = {line.split()[0]: line for line in table[1:8]}
    assert set(rows) == {"random", "dotprod", "gpupacking", "bestfit", "fgd", "koordinator", "topoalloc"}
    assert "topoalloc demo -v" in outputs["short"]


def test_the_full_tables_keep_only_what_says_something(outputs: dict[str, str]) -> None:
    full = outputs["full"]
    assert "multi at best" not in full and "multi-GPU on node's best link %" in full
    # The 4-GPU pods of three seeds are a pod or two: said, not turned into percentages.
    assert re.search(r"4-GPU pods: \d arrived over 3 seed\(s\), too few to compare", full)
    assert "8-GPU pods: interconnect of the GPU set" not in full or "8-GPU pods: 9 arrived" not in full
    # In the demo every joint GPU+NIC pod requires SamePCIe: 100% for every policy, one line.
    nic = [line for line in full.splitlines() if "NIC on GPU's switch %" in line]
    assert nic and all(line.startswith("the same for every policy") for line in nic)


def test_readme_names_the_plots_the_demo_writes(outputs: dict[str, str]) -> None:
    plots = outputs["plots"].split()
    assert plots == ["fragmentation.png", "topology-vs-load.png", "unallocated.png"]
    simulator = (REPO / "README.md").read_text().split("## Simulator")[1]
    assert "three plots" in simulator
    for name in plots:
        assert f"out/demo/{name}" in simulator
