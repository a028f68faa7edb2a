"""Which Kubernetes versions the installer supports, and the kube-scheduler it pins for them.

The secondary scheduler runs `registry.k8s.io/kube-scheduler` at exactly the server's
major.minor.patch, which Kubernetes' version-skew policy always allows: kube-scheduler must not be
newer than kube-apiserver and may be at most one minor older. A scheduler version given by hand
(`--scheduler-version`) is held to that rule against the server's /version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The oldest minor the manifests work on as written: the agent's ValidatingAdmissionPolicy needs
#: admissionregistration.k8s.io/v1 and the node name in service-account tokens (both 1.30).
MIN_MINOR = (1, 30)
#: The releases the real-cluster test tier runs every test on (tests/support/kube_releases.py).
TESTED = ("v1.35.6", "v1.36.3")
SCHEDULER_IMAGE = "registry.k8s.io/kube-scheduler"

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True, order=True)
class KubeVersion:
    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> KubeVersion:
        """`v1.35.6`, `1.35`, or a vendor's `v1.30.4-eks-a737599` / `v1.29.8-gke.1031000`."""
        match = _VERSION.match(text.strip())
        if match is None:
            raise ValueError(f"{text!r} is not a Kubernetes version (expected vMAJOR.MINOR.PATCH)")
        return cls(int(match[1]), int(match[2]), int(match[3] or 0))

    def __str__(self) -> str:
        return f"v{self.major}.{self.minor}.{self.patch}"

    @property
    def minor_text(self) -> str:
        return f"{self.major}.{self.minor}"


def tested_minors() -> list[KubeVersion]:
    return [KubeVersion.parse(v) for v in TESTED]


def newest_tested() -> KubeVersion:
    return max(tested_minors())


def supported_range() -> str:
    """'1.30-1.36'."""
    newest = newest_tested()
    return f"{MIN_MINOR[0]}.{MIN_MINOR[1]}-{newest.minor_text}"


def server_refusal(server: KubeVersion) -> str | None:
    """Why the installer will not install on this server, or None."""
    if (server.major, server.minor) < MIN_MINOR:
        return (
            f"Kubernetes {server} is older than {MIN_MINOR[0]}.{MIN_MINOR[1]}: the agent's "
            "ValidatingAdmissionPolicy needs admissionregistration.k8s.io/v1 and the node name in "
            "service-account tokens (1.30); upgrade the cluster, or apply the kustomize bases without "
            "daemonset/admission-policy.yaml (README, 'Kubernetes versions')"
        )
    return None


def server_warning(server: KubeVersion) -> str | None:
    """A note for a server newer than any the tests run on (expected to work, not tested)."""
    newest = newest_tested()
    if (server.major, server.minor) > (newest.major, newest.minor):
        return (
            f"Kubernetes {server} is newer than the newest release topoalloc is tested on "
            f"({newest.minor_text}); it is expected to work (the APIs used are GA), but it is not tested"
        )
    return None


def scheduler_skew(server: KubeVersion, scheduler: KubeVersion) -> str | None:
    """Why a kube-scheduler of version `scheduler` may not run against this server (the skew
    policy), or None."""
    if scheduler.major != server.major:
        return f"kube-scheduler {scheduler} and kube-apiserver {server} differ in major version"
    if scheduler.minor > server.minor:
        return (
            f"kube-scheduler {scheduler} is newer than kube-apiserver {server}: the version-skew policy "
            "forbids a scheduler newer than the API server"
        )
    if server.minor - scheduler.minor > 1:
        return (
            f"kube-scheduler {scheduler} is {server.minor - scheduler.minor} minors older than "
            f"kube-apiserver {server}: the version-skew policy allows at most one"
        )
    return None


def scheduler_image(server: KubeVersion, repository: str = SCHEDULER_IMAGE) -> str:
    """The kube-scheduler image matching the server exactly."""
    return f"{repository}:{server}"
