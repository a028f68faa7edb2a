"""`topoalloc version`: the package's, the chart's and the image's versions, as text and JSON, from
the manifests the command uses (the checkout here; the wheel's own copy in test_package.py)."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import yaml
from click.testing import CliRunner

from topoalloc.cli import main

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _run(*args: str) -> str:
    ran = CliRunner().invoke(main, ["version", *args])
    assert ran.exit_code == 0, ran.output
    return ran.stdout


def test_versions_as_json_and_text() -> None:
    chart = yaml.safe_load((REPO / "charts" / "topoalloc" / "Chart.yaml").read_text())
    found = json.loads(_run("-o", "json"))
    assert found == {
        "package": VERSION,
        "chart": {"version": str(chart["version"]), "appVersion": str(chart["appVersion"])},
        "image": f"topoalloc:{VERSION}",  # the tag the kustomize bases set (make image builds it)
        "manifests": str(REPO),
    }
    assert _run().splitlines() == [
        f"package:   topoalloc {VERSION}",
        f"chart:     topoalloc {chart['version']} (appVersion {chart['appVersion']})",
        f"image:     topoalloc:{VERSION}",
        f"manifests: {REPO}",
    ]


def test_the_image_tag_is_read_from_the_manifests(tmp_path: Path) -> None:
    """A folder of other manifests: its own image tag, and no chart when it has none."""
    for tree in ("deploy", "daemonset"):
        shutil.copytree(REPO / tree, tmp_path / tree)
    for base in ("deploy/allocator", "daemonset"):
        path = tmp_path / base / "kustomization.yaml"
        path.write_text(path.read_text().replace(f'newTag: "{VERSION}"', 'newTag: "9.9.9"'))
    found = json.loads(_run("-o", "json", "--manifests", str(tmp_path)))
    assert found["image"] == "topoalloc:9.9.9" and found["chart"] is None
    assert "chart:     none" in _run("--manifests", str(tmp_path))
