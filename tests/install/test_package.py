"""The built package works outside the checkout: `python -m build` makes a wheel and an sdist; the
wheel, installed into a fresh virtual environment in a folder that is no checkout, renders the
installation (`install --dry-run`) from the manifests it carries and names its versions; the sdist
carries the manifests, the chart and the license. Offline: built without build isolation, the
wheel installed without an index, its dependencies taken from this test's environment."""

from __future__ import annotations

import fcntl
import json
import os
import site
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_readme import _commands, section

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
TREES = ("deploy", "daemonset", "charts")


def _files(tree: str) -> set[str]:
    root = REPO / tree
    return {
        str(p.relative_to(REPO))
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # One build at a time: setuptools builds in the checkout itself (topoalloc-<version>/, build/,
    # the egg-info), and this module's tests may run on two xdist workers, each with this fixture.
    # The lock file sits in the session's shared temporary folder.
    lock = tmp_path_factory.getbasetemp().parent / "topoalloc-build.lock"
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        built = subprocess.run(
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (outside the checkout) with the wheel installed; its dependencies are this
    environment's, reached through a .pth (no network)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    (wheel,) = dist.glob("topoalloc-*.whl")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index"]
    ran = subprocess.run([*pip, str(wheel)], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "test-dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv


def _run(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "TOPOALLOC_DEBUG")}
    return subprocess.run(
        [str(venv / "bin" / "topoalloc"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_wheel_renders_the_installation_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    where = subprocess.run(
        [str(installed / "bin" / "python"), "-c", "import topoalloc; print(topoalloc.__file__)"],
        cwd=empty,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(installed), where  # the wheel's copy, not the checkout
    ran = _run(installed, empty, "install", "--dry-run", "--kube-version", "v1.35.6", "-o", "json")
    assert ran.returncode == 0, ran.stderr
    items = json.loads(ran.stdout)["items"]
    objects = {(d["kind"], d["metadata"]["name"]) for d in items}
    for wanted in [
        ("CustomResourceDefinition", "devices.scheduling.koordinator.sh"),
        ("DaemonSet", "topoalloc-agent"),
        ("Deployment", "topoalloc-allocator"),
        ("MutatingWebhookConfiguration", "topoalloc-gang"),
        ("Secret", "topoalloc-allocator-tls"),
        ("ConfigMap", "topoalloc-install"),
    ]:
        assert wanted in objects, wanted
    images = {
        c["image"]
        for d in items
        if d["kind"] in ("DaemonSet", "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"topoalloc:{VERSION}"}
    # The same objects the checkout renders.
    here = subprocess.run(
        [
            sys.executable,
            "-m",
            "topoalloc",
            "install",
            "--dry-run",
            "--kube-version",
            "v1.35.6",
            "-o",
            "json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert here.returncode == 0, here.stderr
    assert objects == {(d["kind"], d["metadata"]["name"]) for d in json.loads(here.stdout)["items"]}


def test_the_wheel_names_its_versions(installed: Path, tmp_path: Path) -> None:
    ran = _run(installed, tmp_path, "version", "-o", "json")
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout)
    chart = yaml.safe_load((REPO / "charts" / "topoalloc" / "Chart.yaml").read_text())
    assert found["package"] == VERSION
    assert found["chart"] == {"version": str(chart["version"]), "appVersion": str(chart["appVersion"])}
    assert found["image"] == f"topoalloc:{VERSION}"
    assert Path(found["manifests"]).is_relative_to(installed)
    text = _run(installed, tmp_path, "version")
    assert text.returncode == 0 and f"package:   topoalloc {VERSION}" in text.stdout


def test_the_wheel_carries_every_manifest_and_the_license(dist: Path) -> None:
    (wheel,) = dist.glob("topoalloc-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for tree in TREES:
        wanted = {f"topoalloc/_manifests/{name}" for name in _files(tree)}
        assert wanted and wanted <= names, sorted(wanted - names)[:5]
    assert not [n for n in names if "hw-fixtures" in n]
    info = f"topoalloc-{VERSION}.dist-info"
    assert f"{info}/licenses/LICENSE" in names
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata


def test_the_sdist_carries_the_manifests_the_chart_and_the_license(dist: Path) -> None:
    (sdist,) = dist.glob("topoalloc-*.tar.gz")
    prefix = f"topoalloc-{VERSION}/"
    with tarfile.open(sdist) as tar:
        names = {n.removeprefix(prefix) for n in tar.getnames()}
        license_text = tar.extractfile(prefix + "LICENSE").read().decode()  # type: ignore[union-attr]
    for tree in TREES:
        assert _files(tree) <= names, sorted(_files(tree) - names)[:5]
    assert {"LICENSE", "CHANGELOG.md", "README.md", "build_bundle.py", "charts/topoalloc/Chart.yaml"} <= names
    assert not [n for n in names if n.startswith("hw-fixtures")]
    assert license_text == (REPO / "LICENSE").read_text()


def test_the_readmes_install_commands_name_what_the_build_makes(dist: Path, installed: Path) -> None:
    """README's Install section: the wheel it installs is the one `python -m build` makes, the
    chart and kustomize folders it names exist, and its topoalloc commands run from the wheel."""
    commands = [c.split() for c in _commands(section("Install"))]
    assert [c[:2] for c in commands] == [
        ["helm", "install"], ["python", "-m"], ["pip", "install"], ["topoalloc", "install"],
        ["kubectl", "apply"], ["topoalloc", "install"],
    ]  # fmt: skip
    assert (REPO / commands[0][3] / "Chart.yaml").is_file()
    assert commands[1] == ["python", "-m", "build"]
    (wheel,) = dist.glob("topoalloc-*.whl")
    assert commands[2][2] == f"dist/{wheel.name}"
    assert (REPO / commands[4][3] / "kustomization.yaml").is_file()
    render = commands[5][: commands[5].index(">")]
    ran = _run(installed, dist, *render[1:])
    assert ran.returncode == 0 and "kind: DaemonSet" in ran.stdout, ran.stderr
