"""`install`, `upgrade` and `uninstall` follow the CLI convention without a cluster: bad input is
one line and exit 2 (no kubeconfig, a version out of range, no manifests), an unreachable cluster
exit 1, and `--dry-run --kube-version` renders for GitOps without any cluster."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.cli.conftest import Ran

Run = Callable[..., Ran]


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "home").mkdir()
    return {"HOME": str(tmp_path / "home"), "KUBECONFIG": ""}


@pytest.mark.parametrize("command", [["install"], ["install", "--dry-run"], ["upgrade"], ["uninstall"]])
def test_a_missing_kubeconfig_is_bad_input(topoalloc: Run, home: dict[str, str], command: list[str]) -> None:
    ran = topoalloc(*command, env=home)
    assert ran.code == 2 and ran.clean_error, ran
    assert ran.stderr.startswith("error: kubeconfig (~/.kube/config): not found")


def test_an_unreachable_cluster_is_a_runtime_failure(
    topoalloc: Run, tmp_path: Path, home: dict[str, str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    ran = topoalloc("install", "--kubeconfig", kubeconfig, env=home)
    assert ran.code == 1 and ran.clean_error, ran
    assert ran.stderr.startswith("error: cluster (https://127.0.0.1:9): no answer")


def test_gitops_render_without_a_cluster(topoalloc: Run) -> None:
    placed = topoalloc("install", "--dry-run", "--kube-version", "v1.36.3", "--version", "1.2.3")
    assert placed.code == 0, placed
    kinds = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(placed.stdout)}
    assert ("Deployment", "topoalloc-scheduler") not in kinds  # placement mode: no second scheduler
    ran = topoalloc(
        "install", "--dry-run", "--kube-version", "v1.36.3", "--version", "1.2.3", "--mode", "secondary"
    )
    assert ran.code == 0, ran
    docs = list(yaml.safe_load_all(ran.stdout))
    images = [
        c["image"]
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    ]
    assert sorted(images) == ["registry.k8s.io/kube-scheduler:v1.36.3", "topoalloc:1.2.3", "topoalloc:1.2.3"]
    assert "warning: the output holds private keys" in ran.stderr
    json_ran = topoalloc(
        "install", "--dry-run", "--kube-version", "v1.36.3", "--certs", "cert-manager", "-o", "json"
    )
    assert json_ran.code == 0 and json_ran.stderr == ""
    assert yaml.safe_load(json_ran.stdout)["kind"] == "List"


def test_gitops_render_for_a_release_newer_than_tested_says_so(topoalloc: Run) -> None:
    ran = topoalloc(
        "install", "--dry-run", "--kube-version", "v1.40.0", "--certs", "cert-manager", "--mode", "secondary"
    )
    assert ran.code == 0, ran
    assert ran.stderr == (
        "warning: Kubernetes v1.40.0 is newer than the newest release topoalloc is tested on (1.36); "
        "it is expected to work (the APIs used are GA), but it is not tested\n"
    )
    assert "registry.k8s.io/kube-scheduler:v1.40.0" in ran.stdout


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--dry-run", "--kube-version", "v1.29.4"], "older than 1.30"),
        (["--dry-run", "--kube-version", "latest"], "not a Kubernetes version"),
        (
            [
                "--dry-run",
                "--kube-version",
                "v1.35.6",
                "--mode",
                "secondary",
                "--scheduler-version",
                "v1.36.0",
            ],
            "newer than kube-apiserver",
        ),
        (
            ["--dry-run", "--kube-version", "v1.35.6", "--scheduler-version", "v1.35.6"],
            "only a second kube-scheduler",
        ),
        (["--kube-version", "v1.35.6"], "needs --dry-run"),
        (["--dry-run", "--kube-version", "v1.35.6", "--mode", "kubelet"], "'kubelet' is not one of"),
    ],
)
def test_bad_install_flags_are_exit_2(topoalloc: Run, args: list[str], why: str) -> None:
    ran = topoalloc("install", *args)
    assert ran.code == 2 and ran.clean_error, ran
    assert why in ran.stderr


def test_manifests_that_are_not_there(topoalloc: Run, tmp_path: Path) -> None:
    ran = topoalloc("install", "--dry-run", "--kube-version", "v1.35.6", "--manifests", tmp_path)
    assert ran.code == 2 and ran.clean_error
    assert "no deploy or daemonset kustomize base here" in ran.stderr
