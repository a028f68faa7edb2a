"""`topoalloc allocator`: settings from a file, overridden by flags, and clear errors."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from allocator.runtime.config import ServiceConfig
from topoalloc.cli import main


def test_help_lists_the_flags() -> None:
    result = CliRunner().invoke(main, ["allocator", "--help"])
    assert result.exit_code == 0
    for flag in ("--kubeconfig", "--in-cluster", "--tls-cert", "--client-ca", "--allow-client", "--port",
                 "--health-port", "--leader-elect", "--lease-duration", "--weight", "--config"):  # fmt: skip
        assert flag in result.output


def test_file_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "allocator.yaml"
    path.write_text(yaml.safe_dump({
        "port": 9443, "allowedClients": ["CN=a"], "leaderElection": {"leaseDuration": 30, "identity": "x"},
        "scoring": {"weights": {"topology": 2}},
    }))  # fmt: skip
    cfg = ServiceConfig.load(path).updated(port=7443, leader_lease_duration=20.0, health_port=None)
    assert cfg.port == 7443 and cfg.health_port == 8080  # None keeps the file's (or default) value
    assert cfg.leader_election.lease_duration == 20.0 and cfg.leader_election.identity == "x"
    assert cfg.allowed_clients == ["CN=a"] and cfg.scoring == {"weights": {"topology": 2}}


def test_bad_settings_are_usage_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    typo = tmp_path / "typo.yaml"
    typo.write_text("prot: 8443\n")
    result = runner.invoke(main, ["allocator", "--config", str(typo)])
    assert result.exit_code == 2 and "config.prot: unknown setting" in result.output
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("leaderElection: {enabled: yes-please}\n")
    result = runner.invoke(main, ["allocator", "--config", str(wrong)])
    assert result.exit_code == 2 and "leaderElection.enabled" in result.output
    result = runner.invoke(main, ["allocator", "--weight", "topology"])
    assert result.exit_code == 2 and "NAME=WEIGHT" in result.output
    result = runner.invoke(main, ["allocator", "--weight", "topology=-1"])
    assert result.exit_code == 2 and "scoring" in result.output
