"""The deploy works as written on a stock cluster (issue 18): versioned images pulled only when
absent, no required RuntimeClass, the agent under the runtime's default seccomp profile, a
`make image` that builds with podman or docker and says clearly when neither is there."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
kubectl = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (for kustomize) is not installed"
)


def _build(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=True
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] in ("DaemonSet", "Deployment")
    }


@kubectl
@pytest.mark.parametrize("variant", ["daemonset", "deploy"])
def test_our_images_carry_the_package_version_and_pull_if_not_present(variant: str) -> None:
    specs = _pod_specs(_build(REPO / variant))
    ours = [c for spec in specs.values() for c in spec["containers"] if c["image"].startswith("topoalloc")]
    assert ours
    for c in ours:
        assert c["image"] == f"topoalloc:{VERSION}", c["image"]
        assert c["imagePullPolicy"] == "IfNotPresent"
    for spec in specs.values():
        for c in spec["containers"]:
            assert not c["image"].endswith(":latest") and ":" in c["image"], c["image"]


@kubectl
def test_agent_needs_no_runtime_class_unless_the_component_is_added(tmp_path: Path) -> None:
    agent = _pod_specs(_build(REPO / "daemonset"))["DaemonSet/topoalloc-agent"]
    assert "runtimeClassName" not in agent
    assert agent["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # Uncommenting the lines the kustomization offers adds it (on a copy of the tree).
    shutil.copytree(REPO / "daemonset", tmp_path / "daemonset")
    shutil.copytree(REPO / "deploy" / "components", tmp_path / "deploy" / "components")
    kust = tmp_path / "daemonset" / "kustomization.yaml"
    text = kust.read_text()
    assert "# components:\n#   - ../deploy/components/nvidia-runtime-class" in text
    kust.write_text(text.replace("# components:", "components:").replace("#   - ../deploy", "  - ../deploy"))
    with_class = _pod_specs(_build(tmp_path / "daemonset"))["DaemonSet/topoalloc-agent"]
    assert with_class["runtimeClassName"] == "nvidia"


def test_make_image_says_clearly_when_there_is_no_engine() -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    ran = subprocess.run(
        ["make", "-s", "image", "ENGINE="], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode != 0
    assert "neither podman nor docker found" in ran.stderr
    dry = subprocess.run(
        ["make", "-n", "image", "ENGINE=podman"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert f"podman build -f Containerfile -t topoalloc:{VERSION} ." in dry.stdout


def test_the_image_runs_as_non_root_by_default() -> None:
    text = (REPO / "Containerfile").read_text()
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and not user[-1].startswith("0") and user[-1] != "root"


def test_readme_states_the_kubernetes_floor_and_what_degrades() -> None:
    readme = (REPO / "README.md").read_text()
    assert "Kubernetes 1.30" in readme and "ValidatingAdmissionPolicy" in readme
    assert "below 1.30" in readme.lower()
