"""The installer's Python rendering of the kustomize bases equals `kubectl kustomize` for every
base (the bases stay what GitOps users apply), and refuses what it does not render."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from topoalloc.commands.installer import kustomize
from topoalloc.commands.installer.kustomize import Image, KustomizeError, build, ident

REPO = Path(__file__).resolve().parents[2]
BASES = [
    "daemonset",
    "deploy",
    "deploy/crds",
    "deploy/allocator",
    "deploy/secondary-scheduler",
    "deploy/cert-manager",
]


def _kubectl(folder: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=60, check=True
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _by_id(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], Any]:
    return {ident(d): _spaces(d) for d in docs}


def _spaces(node: Any) -> Any:
    """Whitespace runs in strings as one space: kubectl kustomize (kyaml) re-folds a `>-` scalar
    with more-indented lines and doubles those line breaks (the admission policy's CEL, where
    whitespace does not matter); the installer keeps the value YAML gives."""
    if isinstance(node, dict):
        return {k: _spaces(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_spaces(v) for v in node]
    return re.sub(r"\s+", " ", node) if isinstance(node, str) else node


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (for kustomize) is not installed")
@pytest.mark.parametrize("base", BASES)
def test_rendering_equals_kubectl_kustomize(base: str) -> None:
    ours = build(REPO / base)
    theirs = _kubectl(REPO / base)
    assert len(ours) == len(theirs)
    assert _by_id(ours) == _by_id(theirs)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (for kustomize) is not installed")
def test_an_extra_component_and_image_equal_kustomize_with_them(tmp_path: Path) -> None:
    shutil.copytree(REPO / "daemonset", tmp_path / "daemonset")
    shutil.copytree(REPO / "deploy" / "components", tmp_path / "deploy" / "components")
    kust = tmp_path / "daemonset" / "kustomization.yaml"
    text = (
        kust.read_text().replace("# components:", "components:").replace("#   - ../deploy", "  - ../deploy")
    )
    kust.write_text(text.replace('newTag: "0.1.0"', 'newTag: "9.9.9"\n    newName: reg.example/topoalloc'))
    expected = _by_id(_kubectl(tmp_path / "daemonset"))
    ours = build(
        REPO / "daemonset",
        components=(REPO / "deploy" / "components" / "nvidia-runtime-class",),
        images=(Image("topoalloc", "reg.example/topoalloc", "9.9.9"),),
    )
    assert _by_id(ours) == expected
    ds = next(d for d in ours if d["kind"] == "DaemonSet")
    assert ds["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == "reg.example/topoalloc:9.9.9"


def test_what_it_cannot_render_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
    (tmp_path / "kustomization.yaml").write_text("resources: [cm.yaml]\nnamePrefix: x-\n")
    with pytest.raises(KustomizeError, match="uses namePrefix, which the installer does not render"):
        build(tmp_path)
    (tmp_path / "kustomization.yaml").write_text("resources: [cm.yaml, cm.yaml]\n")
    with pytest.raises(KustomizeError, match="ConfigMap a is defined twice"):
        build(tmp_path)


@pytest.mark.parametrize(
    ("image", "name"),
    [
        ("topoalloc", "topoalloc"),
        ("topoalloc:0.1.0", "topoalloc"),
        ("registry:5000/team/topoalloc:1@sha256:abc", "registry:5000/team/topoalloc"),
        ("registry:5000/topoalloc", "registry:5000/topoalloc"),
    ],
)
def test_image_name_drops_tag_and_digest_not_the_registry_port(image: str, name: str) -> None:
    assert kustomize.image_name(image) == name
