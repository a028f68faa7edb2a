"""Every command the README shows runs as written, with the files it names (issue 18). The long
one (`simulate --paper`, minutes) is checked for its inputs, not run."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _commands(text: str = README) -> list[str]:
    blocks = re.findall(r"^```\n(.*?)^```", text, re.S | re.M)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]


def section(title: str, text: str = README) -> str:
    """The README's `## title` section."""
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


# The Deploy section's commands need a cluster: tests/cluster/test_install.py runs them.
DEPLOY = _commands(section("Deploy"))
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
    "command", [c for c in COMMANDS if c.startswith(".venv/bin/topoalloc") and c not in DEPLOY]
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


def test_the_deploy_commands_name_what_exists(tmp_path: Path) -> None:
    """Offline checks of the Deploy section (the cluster tier runs it): its files exist, its make
    targets exist, every topoalloc command's flags parse (a dry run against no cluster)."""
    assert any(c.startswith(".venv/bin/topoalloc install") for c in DEPLOY)
    assert any(c.startswith(".venv/bin/topoalloc uninstall") for c in DEPLOY)
    makefile = (REPO / "Makefile").read_text()
    for command in DEPLOY:
        words = shlex.split(command)
        if words[0] == "make":
            assert re.search(rf"^{re.escape(words[1])}:", makefile, re.M), command
        elif words[:3] == ["kubectl", "apply", "-f"]:
            assert (REPO / words[3]).is_file(), command
        elif words[0] == ".venv/bin/topoalloc":
            ran = _topoalloc([*words[1:], "--help"], tmp_path)
            assert ran.returncode == 0, (command, ran.stderr)
        else:
            assert words[:2] == ["kubectl", "get"], command
