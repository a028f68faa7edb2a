"""Shared helpers for the agent tests: fixture paths, a fixed clock, one discovery pass."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from agent.config import AgentConfig
from agent.fixtures.loader import Fixture
from agent.main_loop import Agent, PassResult
from agent.publish.device_builder import device_object

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "hw-fixtures"
FIXTURE_NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "machine.yaml").is_file())
# Condition timestamps in the golden files come from this clock: 2024-01-01T00:00:00Z.
FIXED_TIME = 1704067200.0


def wait_for(predicate: Callable[[], object], timeout: float = 5.0) -> bool:
    """Poll `predicate` until it is true (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


class AgentLoop:
    """An Agent's main loop running on a thread (no hot-plug) until `stop`."""

    def __init__(self, agent: Agent) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=agent.run, args=(self._stop,), kwargs={"hotplug": False})
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
        assert not self._thread.is_alive()


def fixture_dir(name: str) -> Path:
    return FIXTURES / name


def copy_fixture(name: str, dest: Path) -> Path:
    """A private copy of a fixture (symlinks kept) that a test may change."""
    target = dest / name
    shutil.copytree(FIXTURES / name, target, symlinks=True)
    return target


def one_pass(folder: Path, *, node: str = "node-a", config: AgentConfig | None = None) -> PassResult:
    fx = Fixture.load(folder)
    agent = Agent(
        node_name=node,
        nvml=fx.nvml,
        sysfs_root=fx.sys_root,
        config=config or AgentConfig(),
        clock=lambda: FIXED_TIME,
    )
    try:
        return agent.run_once()
    finally:
        agent.shutdown()


def device_doc(folder: Path, *, node: str = "node-a") -> dict[str, Any]:
    return device_object(one_pass(folder, node=node).device)


def golden(name: str) -> dict[str, Any]:
    return yaml.safe_load((FIXTURES / name / "expected-device.yaml").read_text())


def write_golden(name: str) -> None:
    doc = device_doc(FIXTURES / name, node=name)
    text = yaml.safe_dump(doc, sort_keys=False, width=1000)
    (FIXTURES / name / "expected-device.yaml").write_text(
        "# The Device CR the agent publishes for this fixture (node name = fixture name; condition\n"
        "# times from a fixed clock). Regenerate: python -m tests.agent.support\n" + text
    )


if __name__ == "__main__":  # pragma: no cover
    for fixture in FIXTURE_NAMES:
        write_golden(fixture)
        print("wrote", FIXTURES / fixture / "expected-device.yaml")
