"""The Kubernetes releases the real-cluster tier runs against: v1.35.6 (../shared/k8s) and v1.36.3
(../shared/k8s-1.36), each a kube-apiserver, kube-scheduler and kube-controller-manager unpacked
from its folder (`unpack DIR`) into a cache outside the repository, under a file lock since
several test runs may share it.

`TOPOALLOC_K8S_VERSIONS` (e.g. `1.36`, or `1.35,1.36`, the default) picks the releases a run uses;
`TOPOALLOC_K8S_BIN` moves the cache (one sub-folder per release, default ~/.cache/topoalloc).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import ControlPlaneError

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
ETCD = Path(os.environ.get("TOPOALLOC_ETCD", "/usr/bin/etcd"))
KUBECTL = Path(os.environ.get("TOPOALLOC_KUBECTL") or shutil.which("kubectl") or "/usr/bin/kubectl")
VERSIONS_ENV = "TOPOALLOC_K8S_VERSIONS"


@dataclass(frozen=True)
class KubeRelease:
    version: str  # as kube-apiserver --version prints it: v1.35.6
    folder: Path  # the shared folder holding the compressed binaries and `unpack`
    # Kubernetes' own gang API, alpha: served by this API version with these gates on all three
    # components (../shared/k8s-1.36/README.md; the 1.35 ones from its binaries' --help).
    gang_api: str = ""
    gang_gates: tuple[str, ...] = ()

    @property
    def feature_gates(self) -> dict[str, bool]:
        return dict.fromkeys(self.gang_gates, True)

    @property
    def runtime_config(self) -> dict[str, bool]:
        return {self.gang_api: True} if self.gang_api else {}

    @property
    def minor(self) -> str:
        """1.35"""
        return ".".join(self.version.lstrip("v").split(".")[:2])

    @property
    def test_id(self) -> str:
        """k8s-1.35: how test ids name the release (see RELEASE_IN_TEST_ID)."""
        return f"k8s-{self.minor}"

    @property
    def minor_int(self) -> int:
        return int(self.minor.split(".")[1])

    @property
    def cache(self) -> Path:
        base = Path(os.environ.get("TOPOALLOC_K8S_BIN", str(Path.home() / ".cache" / "topoalloc")))
        return base / f"k8s-{self.version}"

    def missing_parts(self) -> list[str]:
        """What this machine lacks to run this release's control plane (empty: everything)."""
        out = []
        if not (self.folder / "unpack").is_file():
            out.append(f"{self.folder} (Kubernetes {self.version} binaries and their unpack script)")
        if not os.access(ETCD, os.X_OK):
            out.append(f"{ETCD} (Debian package etcd-server)")
        if not os.access(KUBECTL, os.X_OK):
            out.append(f"{KUBECTL} (Debian package kubectl or kubernetes-client)")
        return out

    def unpack(self) -> Path:
        """The folder holding this release's three binaries (unpacked once)."""
        cache = self.cache
        cache.parent.mkdir(parents=True, exist_ok=True)
        with open(cache.parent / f".{cache.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            done = subprocess.run(
                [str(self.folder / "unpack"), str(cache)], capture_output=True, text=True, timeout=300
            )
        if done.returncode != 0:
            raise ControlPlaneError(f"unpacking Kubernetes {self.version} failed: {done.stderr.strip()}")
        return cache


GANG_GATES = ("GenericWorkload", "GangScheduling")
RELEASES = {
    # v1alpha1 Workload, pods join with spec.workloadRef
    "1.35": KubeRelease("v1.35.6", SHARED / "k8s", "scheduling.k8s.io/v1alpha1", GANG_GATES),
    # v1alpha2 Workload + PodGroup, pods join with spec.schedulingGroup; Jobs get one (WorkloadWithJob)
    "1.36": KubeRelease(
        "v1.36.3", SHARED / "k8s-1.36", "scheduling.k8s.io/v1alpha2", (*GANG_GATES, "WorkloadWithJob")
    ),
}
# The release a test id carries (`test_x[k8s-1.35]`, `test_y[k8s-1.36-gpu]`): pytest-xdist's scheduler
# reads it from the id alone (tests/support/xdist_groups.py).
RELEASE_IN_TEST_ID = re.compile(r"[\[-](k8s-\d+\.\d+)[\]-]")
# What a bench or a single-release caller gets when it names none.
DEFAULT = RELEASES["1.35"]


def selected_releases() -> list[KubeRelease]:
    """The releases this run tests against (TOPOALLOC_K8S_VERSIONS, default all, oldest first)."""
    wanted = os.environ.get(VERSIONS_ENV, "").replace(" ", "")
    if not wanted:
        return list(RELEASES.values())
    unknown = [m for m in wanted.split(",") if m.lstrip("v") not in RELEASES]
    if unknown:
        raise ValueError(f"{VERSIONS_ENV}: unknown release(s) {unknown}; known: {sorted(RELEASES)}")
    return [RELEASES[m.lstrip("v")] for m in wanted.split(",")]


def missing_parts(release: KubeRelease = DEFAULT) -> list[str]:
    """What `release` lacks on this machine (the bench scripts' guard)."""
    return release.missing_parts()
