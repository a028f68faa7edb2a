"""Every command the README shows runs as written, with the files it names (issue 18). The long
one (`simulate --paper`, minutes) is checked for its inputs, not run."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _commands() -> list[str]:
    blocks = re.findall(r"^```\n(.*?)^```", README, re.S | re.M)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]


COMMANDS = _commands()


def test_the_readme_shows_the_commands_we_check() -> None:
    assert COMMANDS[:2] == ["make run", "make test"]
    assert any("--pod examples/pod.yaml" in c for c in COMMANDS)
    assert "device-joint-allocate" in README and "(minutes)" in README


def _topoalloc(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "topoalloc", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "command", [c for c in COMMANDS if c.startswith(".venv/bin/topoalloc") and " certs " not in c]
)
def test_topoalloc_commands_run_as_written(command: str) -> None:
    args = shlex.split(command)[1:]
    if args[:2] == ["simulate", "--paper"]:
        for word in args:  # the files it names are there; running it takes minutes
            assert not word.endswith((".yaml", ".csv")) or (REPO / word).exists()
        return
    for word in args:
        if "/" in word and not word.startswith("-"):
            assert (REPO / word).exists(), word
    ran = _topoalloc(args, REPO)
    assert ran.returncode == 0, (command, ran.stderr)
    assert ran.stdout and "Traceback" not in ran.stderr


def test_the_deploy_commands_run_as_written(tmp_path: Path) -> None:
    certs = next(c for c in COMMANDS if " certs " in c)
    ran = _topoalloc(shlex.split(certs)[1:], tmp_path)
    assert ran.returncode == 0, ran.stderr
    for command in COMMANDS:
        words = shlex.split(command)
        if words[:3] == ["kubectl", "apply", "-f"]:
            assert (tmp_path / words[3]).is_file(), command
        elif words[:3] == ["kubectl", "apply", "-k"]:
            assert (REPO / words[3] / "kustomization.yaml").is_file(), command
            if shutil.which("kubectl"):
                built = subprocess.run(
                    ["kubectl", "kustomize", str(REPO / words[3])], capture_output=True, timeout=60
                )
                assert built.returncode == 0, built.stderr
        elif words[0] == "make":
            makefile = (REPO / "Makefile").read_text()
            assert re.search(rf"^{re.escape(words[1])}:", makefile, re.M), command
