"""`topoalloc doctor` as a user runs it, against the fake API server over real HTTP (the real
installation: tests/cluster/test_doctor.py): on a cluster where nothing is installed every missing
part is a failure with its fix, exit 1, as text and as JSON, read-only; bad flags, a missing
kubeconfig and an unreachable cluster are one line on stderr with the convention's exit status."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

from tests.cli.conftest import Ran
from tests.support.fakeapi import FakeApiServer
from tests.support.kubeconfig import token_kubeconfig

Run = Callable[..., Ran]


def test_nothing_installed_is_a_failure_named_part_by_part(
    topoalloc: Run, fake_api_thread: FakeApiServer, tmp_path: Path
) -> None:
    config = token_kubeconfig(tmp_path, fake_api_thread.url)
    ran = topoalloc("doctor", "--kubeconfig", config)
    assert ran.code == 1, ran.stderr
    assert "Traceback" not in ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    assert (
        lines[0].startswith(f"cluster {fake_api_thread.url} (Kubernetes ")
        and "not installed (no install record in topoalloc-system" in lines[0]
    )
    for said in (
        "FAIL  crds       CRD devices.scheduling.koordinator.sh is not there",
        "FAIL  allocator  no Deployment topoalloc-system/topoalloc-allocator",
        "FAIL  webhooks   no MutatingWebhookConfiguration topoalloc-gang",
        "FAIL  agents     no DaemonSet topoalloc-system/topoalloc-agent",
    ):
        assert any(line.startswith(said) for line in lines), (said, ran.stdout)
    assert "fix: topoalloc install" in ran.stdout
    data = json.loads(topoalloc("doctor", "--kubeconfig", config, "-o", "json").stdout)
    assert data["healthy"] is False and data["summary"]["fail"] >= 6
    assert {"check", "status", "what"} <= set(data["checks"][0])
    assert {r.method for r in fake_api_thread.requests()} == {"GET"}  # read-only: no probe without a webhook


def test_bad_flags_and_kubeconfigs_are_bad_input(
    topoalloc: Run, fake_api_thread: FakeApiServer, tmp_path: Path
) -> None:
    config = token_kubeconfig(tmp_path, fake_api_thread.url)
    for args, said in (
        (("--gated-after", "soon"), "'soon' is not a duration"),
        (("--probe-namespace", "kube-system"), "the webhooks never see pods there"),
        (("--scheduler-config", str(tmp_path / "missing.yaml")), "does not exist"),
        (("-o", "xml"), "invalid value for '-o'"),
    ):
        ran = topoalloc("doctor", "--kubeconfig", config, *args)
        assert ran.code == 2 and ran.clean_error and said in ran.stderr, (args, ran.stderr)
    missing = topoalloc("doctor", "--kubeconfig", tmp_path / "nope")
    assert missing.code == 2 and missing.clean_error and "kubeconfig" in missing.stderr
    assert fake_api_thread.requests() == []


def test_an_unreachable_cluster_is_a_runtime_failure(topoalloc: Run, tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ran = topoalloc("doctor", "--kubeconfig", token_kubeconfig(tmp_path, f"http://127.0.0.1:{port}"))
    assert ran.code == 1 and ran.clean_error and ran.stderr.startswith("error: cluster (http://127.0.0.1:")


def test_wait_with_a_dry_run_is_a_usage_error(topoalloc: Run) -> None:
    for args in (
        ("install", "--dry-run", "--wait"),
        ("install", "--dry-run", "--wait", "--kube-version", "v1.35.6"),
    ):
        ran = topoalloc(*args)
        assert ran.code == 2 and ran.clean_error and "--wait" in ran.stderr, ran.stderr
