"""Run `topoalloc` the way a user does: the real top-level command (its error convention
included), in-process through click's runner; stdout and stderr apart."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from topoalloc.cli import main

REPO = Path(__file__).resolve().parents[2]
DGX = REPO / "hw-fixtures" / "dgx-h100"
DGX_DEVICE = DGX / "expected-device.yaml"


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str

    @property
    def clean_error(self) -> bool:
        """One `error: ` line on stderr, nothing on stdout, no traceback anywhere."""
        lines = self.stderr.strip().splitlines()
        return (
            "Traceback" not in self.stdout + self.stderr
            and self.stdout == ""
            and bool(lines)
            and lines[-1].startswith("error: ")
            and not any(line.startswith("Error:") for line in lines)
        )


@pytest.fixture
def topoalloc(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Ran]:
    monkeypatch.delenv("TOPOALLOC_DEBUG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    def run(*args: str | Path, env: dict[str, str] | None = None) -> Ran:
        result = CliRunner().invoke(main, [str(a) for a in args], env=env, catch_exceptions=True)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise AssertionError(f"escaped the error convention: {result.exception!r}") from result.exception
        return Ran(result.exit_code, result.stdout, result.stderr)

    return run
