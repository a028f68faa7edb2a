"""The demo's plots and table read at a glance (issue 18): every line in a legend, both axes
labelled, the 100% line named, and caption lines under the table that explain why pods fail and
why fragmentation is above zero on an empty cluster."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from click.testing import CliRunner

from simulator import plots
from topoalloc.cli import main


def test_demo_plots_and_caption(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figures: list[plt.Figure] = []
    monkeypatch.setattr(plots.plt, "close", figures.append)  # keep the figures to look at them
    ran = CliRunner().invoke(
        main,
        [
            "demo",
            "--seeds",
            "1",
            "--policies",
            "fgd,topoalloc",
            "--out",
            str(tmp_path),
            "--no-progress",
            "-v",
        ],
    )
    assert ran.exit_code == 0, ran.output
    text = " ".join(ran.stdout.split())  # the caption is wrapped
    assert re.search(r"Pods failed: the workload's GPU demand keeps arriving up to 1[0-9][0-9]% ", text)
    assert "Fragmentation (fragmentation.png) starts at " in text and "on the empty cluster" in text
    ours = [fig for fig in figures if fig.legends]  # plot_runs' two; other reports draw their own
    assert len(ours) == 2
    for fig in ours:
        assert len(fig.legends) == 1
        texts = [t.get_text() for t in fig.legends[0].get_texts()]
        assert texts == ["fgd", "topoalloc", plots.CAPACITY_LABEL]
        for ax in fig.axes:
            assert ax.get_xlabel() and ax.get_ylabel()
            assert any(line.get_label() == plots.CAPACITY_LABEL for line in ax.get_lines())
        # policies that overlap stay apart by dash pattern and marker, not colour alone
        styles = {(line.get_linestyle(), line.get_marker()) for line in fig.axes[0].get_lines()[:-1]}
        assert len(styles) == 2
    for png in ("unallocated.png", "fragmentation.png"):
        assert (tmp_path / png).read_bytes().startswith(b"\x89PNG")
