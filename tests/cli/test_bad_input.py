"""Issue 18, "Why": every input a new user tried that ended in a traceback or a wrong success,
run through the real `topoalloc` command. Each case failed before the issue and passes now."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.cli.conftest import DGX, DGX_DEVICE, REPO, Ran

LATIN1 = b"apiVersion: v1\nkind: Pod\nmetadata: {name: caf\xe9}\n"


def _pod(limits: dict[str, str], annotations: dict[str, str] | None = None) -> dict:
    meta: dict = {"name": "p", "namespace": "default"}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]},
    }


def _write(tmp_path: Path, name: str, content: bytes | str | dict) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(yaml.safe_dump(content))
    return path


Run = Callable[..., Ran]

# -- tracebacks instead of errors ---------------------------------------------------------------


def test_non_utf8_files_are_errors_not_tracebacks(topoalloc: Run, tmp_path: Path) -> None:
    bad = _write(tmp_path, "bad.yaml", LATIN1)
    csv = _write(tmp_path, "nodes.csv", b"sn,cpu_milli,memory_mib,gpu,model\nn\xe9,1,1,1,V100\n")
    workload = REPO / "simulator" / "data" / "demo-workload.yaml"
    cases = [
        ("allocate", "--device", DGX_DEVICE, "--pod", bad),
        ("allocate", "--device", bad, "--pod", _write(tmp_path, "ok.yaml", _pod({}))),
        ("inspect", bad),
        ("agent", "--config", bad, "--once", "--print", "--fixture", DGX),
        ("simulate", "--workload", bad, "--nodes", "hw-fixtures:cpu-only=1", "--no-plots"),
        ("simulate", "--workload", workload, "--nodes", csv, "--seeds", "1", "--no-plots"),
    ]
    for args in cases:
        ran = topoalloc(*args)
        assert ran.code == 2 and ran.clean_error, (args, ran)
        assert "not UTF-8 text" in ran.stderr, (args, ran.stderr)


def test_malformed_yaml_to_inspect_names_the_line(topoalloc: Run, tmp_path: Path) -> None:
    bad = _write(tmp_path, "d.yaml", "kind: Device\nspec: {devices: [\n")
    ran = topoalloc("inspect", bad)
    assert ran.code == 2 and ran.clean_error
    assert f"error: device file ({bad}:" in ran.stderr and "not valid YAML" in ran.stderr


def test_malformed_agent_config_names_the_line_once(topoalloc: Run, tmp_path: Path) -> None:
    bad = _write(tmp_path, "agent.yaml", "resyncSeconds: [1\n")
    ran = topoalloc("agent", "--config", bad, "--once", "--print", "--fixture", DGX)
    assert ran.code == 2 and ran.clean_error
    assert f"error: agent config ({bad}:2:1): not valid YAML" in ran.stderr
    assert ran.stderr.count(str(bad)) == 1


def test_certs_bad_ip_is_a_usage_error(topoalloc: Run, tmp_path: Path) -> None:
    ran = topoalloc("certs", "--out", tmp_path / "c", "--ip", "999.1.1.1")
    assert ran.code == 2 and ran.clean_error
    assert "'999.1.1.1' is not an IPv4 or IPv6 address" in ran.stderr
    assert not (tmp_path / "c").exists()


def test_certs_with_a_ca_file_that_is_no_certificate(topoalloc: Run, tmp_path: Path) -> None:
    junk = _write(tmp_path, "ca.crt", "not a certificate\n")
    key = _write(tmp_path, "ca.key", "not a key\n")
    ran = topoalloc("certs", "--out", tmp_path / "c", "--ca-cert", junk, "--ca-key", key)
    assert ran.code == 2 and ran.clean_error
    assert f"({junk}): not a PEM certificate" in ran.stderr


@pytest.fixture
def pem(topoalloc: Run, tmp_path: Path) -> Path:
    out = tmp_path / "pki"
    assert topoalloc("certs", "--out", out).code == 0
    return out


def test_allocator_without_a_kubeconfig(topoalloc: Run, pem: Path, tmp_path: Path) -> None:
    tls = ("--tls-cert", pem / "tls.crt", "--tls-key", pem / "tls.key", "--client-ca", pem / "ca.crt")
    ran = topoalloc("allocator", *tls, env={"HOME": str(tmp_path), "KUBECONFIG": ""})
    assert ran.code == 2 and ran.clean_error
    assert "error: kubeconfig (~/.kube/config):" in ran.stderr and "--kubeconfig" in ran.stderr
    missing = topoalloc("allocator", *tls, "--kubeconfig", tmp_path / "nope")
    assert missing.code == 2 and missing.clean_error and "--kubeconfig" in missing.stderr


def test_allocator_with_missing_or_wrong_tls_files(topoalloc: Run, pem: Path, tmp_path: Path) -> None:
    cases = [
        ((pem / "nope.crt", pem / "tls.key", pem / "ca.crt"), "cannot read: No such file"),
        ((pem / "tls.crt", pem / "client.key", pem / "ca.crt"), "does not belong to the certificate"),
        ((pem / "tls.crt", pem / "tls.key", pem / "tls.key"), "client CA bundle"),
    ]
    unreadable = pem / "locked.key"
    unreadable.write_bytes((pem / "tls.key").read_bytes())
    unreadable.chmod(0)
    import os

    if os.geteuid() != 0:  # root reads anything
        cases.append(((pem / "tls.crt", unreadable, pem / "ca.crt"), "Permission denied"))
    for (cert, key, ca), words in cases:
        ran = topoalloc("allocator", "--tls-cert", cert, "--tls-key", key, "--client-ca", ca)
        assert ran.code == 2 and ran.clean_error, ran
        assert words in ran.stderr, ran.stderr


# -- wrong success ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("", "is empty: expected one Pod"),
        (yaml.safe_dump_all([_pod({}), _pod({})]), "holds 2 YAML documents"),
        (
            yaml.safe_dump({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {}}),
            "is a apps/v1 Deployment",
        ),
        (yaml.safe_dump(_pod({"nvidia.com/gpu": "-1"})), "must not be negative"),
        (yaml.safe_dump(_pod({"memory": "-1Gi"})), "must not be negative"),
        (yaml.safe_dump(_pod({"nvidia.com/gpu": "1.5"})), "must be a whole number"),
        (yaml.safe_dump(_pod({"nvidia.com/gpu": "1e21"})), "too large"),
        (yaml.safe_dump(_pod({"koordinator.sh/gpu-memory-ratio": "1e30"})), "too large"),
        (yaml.safe_dump(_pod({"koordinator.sh/gpu-memory-ratio": "150"})), "a percentage of one GPU"),
    ],
)
def test_allocate_refuses_what_kubernetes_refuses(
    topoalloc: Run, tmp_path: Path, content: str, words: str
) -> None:
    pod = _write(tmp_path, "pod.yaml", content)
    ran = topoalloc("allocate", "--device", DGX_DEVICE, "--pod", pod)
    assert ran.code == 2 and ran.clean_error, ran
    assert ran.stderr.startswith(f"error: pod file ({pod}): ") and words in ran.stderr


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"resources": {"koordinator.sh/gpu-core": "-100"}}, "must not be negative"),
        ({"resources": {"koordinator.sh/gpu-memory-ratio": "1e30"}}, "too large"),
        ({"resources": {"koordinator.sh/gpu-memory-ratio": "400"}}, "a percentage of one device"),
        ({"type": "tpu"}, "unknown device type"),
    ],
)
def test_bad_device_crs_are_refused(topoalloc: Run, tmp_path: Path, change: dict, words: str) -> None:
    device = yaml.safe_load(DGX_DEVICE.read_text())
    broken = copy.deepcopy(device)
    broken["spec"]["devices"][0].update(change)
    path = _write(tmp_path, "device.yaml", broken)
    pod = _write(tmp_path, "pod.yaml", _pod({"nvidia.com/gpu": "1"}))
    for args in (("allocate", "--device", path, "--pod", pod), ("inspect", path)):
        ran = topoalloc(*args)
        assert ran.code == 2 and ran.clean_error, (args, ran)
        assert "spec.devices[0]" in ran.stderr and words in ran.stderr


def test_explain_never_says_fits_for_a_device_the_selector_excludes(topoalloc: Run, tmp_path: Path) -> None:
    hint = '{"gpu":{"selector":{"matchLabels":{"no-such-label":"x"}}}}'
    pod = _write(
        tmp_path,
        "pod.yaml",
        _pod({"nvidia.com/gpu": "1"}, {"scheduling.koordinator.sh/device-allocate-hint": hint}),
    )
    ran = topoalloc("allocate", "--device", DGX_DEVICE, "--pod", pod, "--explain")
    assert ran.code == 1
    gpu_lines = [line for line in ran.stderr.splitlines() if line.startswith("  gpu ")]
    assert len(gpu_lines) == 8
    assert all(line.endswith("excluded by the device selector, score 50") for line in gpu_lines), gpu_lines


def test_agent_with_a_sysfs_root_that_does_not_exist(topoalloc: Run) -> None:
    ran = topoalloc("agent", "--sysfs-root", "/nonexistent", "--once", "--print", "--node-name", "n")
    assert ran.code == 2 and ran.clean_error
    assert "--sysfs-root" in ran.stderr and "does not exist" in ran.stderr


@pytest.mark.parametrize("flag", ["--config", "--scoring"])
@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("port: [1\n", ":2:1): not valid YAML"),
        ("- 1\n- 2\n", "): expected a mapping at the top level, not a list"),
        ("a: 1\n---\nb: 2\n", "): holds 2 YAML documents: expected one mapping"),
    ],
)
def test_allocator_settings_files_that_are_not_one_mapping(
    topoalloc: Run, pem: Path, tmp_path: Path, flag: str, content: str, words: str
) -> None:
    bad = _write(tmp_path, "settings.yaml", content)
    tls = ("--tls-cert", pem / "tls.crt", "--tls-key", pem / "tls.key", "--client-ca", pem / "ca.crt")
    ran = topoalloc("allocator", *tls, flag, bad)
    assert ran.code == 2 and ran.clean_error, ran
    what = "allocator config" if flag == "--config" else "scoring file"
    assert f"error: {what} ({bad}" in ran.stderr and words in ran.stderr, ran.stderr
