"""The frictions a new user hit in the first hour (issue 31, "Why"): each was silent or unclear
and is now a clear error or a clear sentence."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from allocator.runtime import certs as pki
from tests.cli.conftest import DGX, DGX_DEVICE, REPO, Ran
from tests.support.allocator_harness import device, node
from tests.support.fakeapi import FakeApiServer
from tests.support.kubeconfig import token_kubeconfig

Run = Callable[..., Ran]
L40S_DEVICE = REPO / "hw-fixtures" / "l40s-8x-pcie" / "expected-device.yaml"


def _pod(tmp_path: Path, limits: dict[str, str], name: str = "pod.yaml") -> Path:
    path = tmp_path / name
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]},
    }
    path.write_text(yaml.safe_dump(pod))
    return path


def test_topoalloc_without_arguments_prints_one_line(topoalloc: Run) -> None:
    ran = topoalloc()
    assert ran.code == 2 and ran.clean_error
    assert ran.stderr.count("\n") == 1
    assert (
        "usage: " in ran.stderr and "[OPTIONS] COMMAND [ARGS]..." in ran.stderr and " --help')" in ran.stderr
    )


def test_a_resource_typo_is_refused_with_a_suggestion(topoalloc: Run, tmp_path: Path) -> None:
    ran = topoalloc("allocate", "--device", DGX_DEVICE, "--pod", _pod(tmp_path, {"nvidia.com/gpus": "2"}))
    assert ran.code == 2 and ran.clean_error, ran
    assert "unknown resource nvidia.com/gpus (did you mean nvidia.com/gpu?)" in ran.stderr
    ran = topoalloc(
        "allocate", "--device", DGX_DEVICE, "--pod", _pod(tmp_path, {"koordinator.sh/gpu_core": "50"})
    )
    assert ran.code == 2 and "did you mean koordinator.sh/gpu-core?" in ran.stderr


def test_a_real_vendor_resource_we_do_not_allocate_is_a_warning(topoalloc: Run, tmp_path: Path) -> None:
    pod = _pod(tmp_path, {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"})
    ran = topoalloc("allocate", "--device", DGX_DEVICE, "--pod", pod)
    assert ran.code == 0, ran
    assert "warning: pod file" in ran.stderr and "nvidia.com/mig-1g.10gb is not a resource" in ran.stderr


@pytest.mark.parametrize("device", [DGX_DEVICE, L40S_DEVICE], ids=["partitions", "no-partitions"])
def test_more_gpus_than_the_node_has_says_so(topoalloc: Run, tmp_path: Path, device: Path) -> None:
    ran = topoalloc("allocate", "--device", device, "--pod", _pod(tmp_path, {"nvidia.com/gpu": "9"}))
    assert ran.code == 1
    assert ran.stdout.strip() == "need 9 GPUs; the node has 8 GPUs"


def test_inspect_refuses_a_file_that_is_not_a_device(topoalloc: Run, tmp_path: Path) -> None:
    ran = topoalloc("inspect", DGX / "machine.yaml")
    assert ran.code == 2 and ran.clean_error, ran
    assert "holds no Device CR" in ran.stderr
    node = tmp_path / "node.yaml"
    node.write_text("apiVersion: v1\nkind: Node\nmetadata: {name: n}\n")
    ran = topoalloc("inspect", node)
    assert ran.code == 2 and "holds Node, not a Device CR" in ran.stderr
    # A Device with no devices is still a Device: said, exit 0.
    ran = topoalloc("inspect", REPO / "hw-fixtures" / "cpu-only" / "expected-device.yaml")
    assert ran.code == 0 and "no GPUs or RDMA devices" in ran.stdout


def test_a_score_component_typo_is_refused_with_the_known_names(topoalloc: Run, tmp_path: Path) -> None:
    ran = topoalloc("allocator", "--weight", "topolgy=2")
    assert ran.code == 2 and ran.clean_error, ran
    assert "unknown score component 'topolgy' (did you mean topology?)" in ran.stderr
    assert "known: fit, scarce, topology, fragmentation, device" in ran.stderr
    scoring = tmp_path / "scoring.yaml"
    scoring.write_text("weights: {fragmentaton: 2}\n")
    ran = topoalloc("allocator", "--scoring", scoring)
    assert ran.code == 2 and "unknown score component 'fragmentaton'" in ran.stderr


@pytest.fixture
def no_kubeconfig(tmp_path: Path) -> dict[str, str]:
    """An environment whose home has no ~/.kube/config and no KUBECONFIG."""
    home = tmp_path / "home"
    home.mkdir()
    return {"HOME": str(home), "KUBECONFIG": ""}


def test_a_missing_kubeconfig_is_bad_input_everywhere(
    topoalloc: Run, tmp_path: Path, no_kubeconfig: dict
) -> None:
    issued = pki.make_ca()
    server = pki.server_cert(issued, "topoalloc-allocator", "topoalloc-system")
    issued.write(tmp_path / "ca.crt", tmp_path / "ca.key")
    server.write(tmp_path / "tls.crt", tmp_path / "tls.key")
    tls = [
        "--tls-cert",
        tmp_path / "tls.crt",
        "--tls-key",
        tmp_path / "tls.key",
        "--client-ca",
        tmp_path / "ca.crt",
    ]
    cases = [
        ("allocator", *tls),
        ("agent", "--fixture", DGX, "--node-name", "n1"),
        ("inspect", "--node", "n1"),
    ]
    for args in cases:
        ran = topoalloc(*args, env=no_kubeconfig)
        assert ran.code == 2 and ran.clean_error, (args, ran)
        assert ran.stderr.startswith("error: kubeconfig (~/.kube/config): not found"), (args, ran.stderr)
    nope = str(tmp_path / "nope")
    for args in cases[:2]:
        ran = topoalloc(*args, env={**no_kubeconfig, "KUBECONFIG": nope})
        assert ran.code == 2 and f"error: kubeconfig (KUBECONFIG={nope}): not found" in ran.stderr, (
            args,
            ran,
        )


def _git(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_private_keys_in_a_work_tree_are_ignored_or_warned_about(topoalloc: Run, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    assert _git("init", "-q", cwd=repo).returncode == 0
    ran = topoalloc("certs", "--out", repo / "pki")
    assert ran.code == 0
    assert "warning: " in ran.stderr and "ca.key" in ran.stderr and "not ignored by git" in ran.stderr
    (repo / ".gitignore").write_text("/pki/\n")
    ran = topoalloc("certs", "--out", repo / "pki", "--force")
    assert ran.code == 0 and ran.stderr == ""
    # The README's own folder is ignored in this repository.
    if _git("rev-parse", "--show-toplevel", cwd=REPO).returncode == 0:
        assert _git("check-ignore", "-q", "certs/ca.key", cwd=REPO).returncode == 0


def test_inspect_node_tells_a_missing_node_from_a_node_without_a_device(
    topoalloc: Run, fake_api_thread: FakeApiServer, tmp_path: Path
) -> None:
    fake_api_thread.put(node("cpu-1", gpus=0))
    fake_api_thread.put(node("gpu-1"))
    fake_api_thread.put(device("gpu-1"))
    config = token_kubeconfig(tmp_path, fake_api_thread.url)
    assert topoalloc("inspect", "--node", "gpu-1", "--kubeconfig", config).code == 0
    missing = topoalloc("inspect", "--node", "nope", "--kubeconfig", config)
    assert missing.code == 2 and missing.clean_error
    assert (
        missing.stderr.strip()
        == "error: --node (nope): no Node of that name in the cluster (kubectl get nodes)"
    )
    bare = topoalloc("inspect", "--node", "cpu-1", "--kubeconfig", config)
    assert bare.code == 1 and bare.clean_error
    assert bare.stderr.startswith(
        "error: Device (cpu-1): the Node exists but has no Device: no topoalloc agent has published one"
    )
