"""`topoalloc agent record-fixture DIR`: record this machine (or a fixture's replay) as a hardware fixture."""

from __future__ import annotations

from typing import Any

import click


@click.command("record-fixture")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--sysfs-root", default="/sys", show_default=True, help="sysfs to copy from.")
@click.option("--machine", default="", help="What this machine is (goes into nvml.json and the README).")
@click.option(
    "--from-fixture", type=click.Path(exists=True, file_okay=False), help="Record a fixture's replay (tests)."
)
def record_fixture(directory: str, sysfs_root: str, machine: str, from_fixture: str | None) -> None:
    """Record this machine (NVML through pynvml, the sysfs files the agent reads) as a fixture."""
    from agent.fixtures.recorder import record

    if from_fixture:
        from agent.fixtures.loader import Fixture

        fx = Fixture.load(from_fixture)
        nvml: Any = fx.nvml
        sysfs_root = str(fx.sys_root)
    else:
        import pynvml

        nvml = pynvml
    summary = record(nvml, sysfs_root, directory, machine=machine)
    click.echo(summary)
