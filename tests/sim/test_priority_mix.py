"""The timed priority mix (simulator/priority_mix.py): preemption places gangs sooner and pays in
lost batch GPU-hours; without it nothing is lost."""

from __future__ import annotations

from click.testing import CliRunner

from simulator.priority_mix import MixSettings, run_mix
from topoalloc.cli import main

SMALL = MixSettings(racks=1, days=1.0, load=0.9, gang_every_hours=4.0, seed=3)


def test_preemption_trades_batch_gpu_hours_for_gang_wait() -> None:
    with_p = run_mix(SMALL, preempt=True)
    without = run_mix(SMALL, preempt=False)
    assert with_p.gangs == without.gangs > 0
    assert without.gpu_hours_lost == 0 and without.victims == 0
    assert with_p.victims > 0 and with_p.gpu_hours_lost > 0
    assert with_p.gangs_placed >= without.gangs_placed
    assert with_p.gang_wait_p50 <= without.gang_wait_p50
    assert run_mix(SMALL, preempt=True) == with_p  # seeded: the same run twice


def test_the_command_prints_both_policies() -> None:
    result = CliRunner().invoke(main, ["priority-mix", "--days", "0.25", "--racks", "1", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "preemption" in result.output and "no preemption" in result.output
    bad = CliRunner().invoke(main, ["priority-mix", "--load", "2"])
    assert bad.exit_code != 0 and "--load" in bad.output
