"""The Kubernetes versions the installer takes, and the kube-scheduler version-skew rule it holds
the secondary scheduler to (against each release's real /version in tests/cluster/test_install.py)."""

from __future__ import annotations

import pytest

from tests.support.kube_releases import RELEASES
from topoalloc.commands.installer import versions
from topoalloc.commands.installer.versions import KubeVersion, scheduler_skew


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("v1.35.6", KubeVersion(1, 35, 6)),
        ("1.36", KubeVersion(1, 36, 0)),
        ("v1.30.4-eks-a737599", KubeVersion(1, 30, 4)),
        ("v1.29.8-gke.1031000", KubeVersion(1, 29, 8)),
        ("v1.31.2+k3s1", KubeVersion(1, 31, 2)),
    ],
)
def test_server_versions_of_vendors_parse(text: str, parsed: KubeVersion) -> None:
    assert KubeVersion.parse(text) == parsed
    assert str(parsed) == f"v{parsed.major}.{parsed.minor}.{parsed.patch}"


@pytest.mark.parametrize("text", ["", "latest", "vX.1", "one.two"])
def test_garbage_is_not_a_version(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes version"):
        KubeVersion.parse(text)


def test_the_skew_rule_over_many_versions() -> None:
    """kube-scheduler: never newer than kube-apiserver, at most one minor older, same major."""
    for server_minor in range(20, 45):
        server = KubeVersion(1, server_minor, 3)
        for scheduler_minor in range(server_minor - 4, server_minor + 4):
            for patch in (0, 3, 9):
                scheduler = KubeVersion(1, scheduler_minor, patch)
                allowed = server_minor - 1 <= scheduler_minor <= server_minor
                assert (scheduler_skew(server, scheduler) is None) == allowed, (server, scheduler)
        assert scheduler_skew(server, server) is None  # the pin: the server's own version
        assert "major" in (scheduler_skew(server, KubeVersion(2, server_minor, 0)) or "")
    assert "newer than kube-apiserver" in (scheduler_skew(KubeVersion(1, 30), KubeVersion(1, 31)) or "")
    assert "at most one" in (scheduler_skew(KubeVersion(1, 35), KubeVersion(1, 32, 13)) or "")


def test_the_supported_range_and_what_lies_outside() -> None:
    for minor in range(30, 37):
        server = KubeVersion(1, minor, 0)
        assert versions.server_refusal(server) is None and versions.server_warning(server) is None
    refused = versions.server_refusal(KubeVersion(1, 29, 9))
    assert refused and "older than 1.30" in refused and "ValidatingAdmissionPolicy" in refused
    warned = versions.server_warning(KubeVersion(1, 37, 0))
    assert warned and "not tested" in warned
    assert versions.supported_range() == "1.30-1.36"


def test_the_tested_releases_are_the_real_cluster_tiers() -> None:
    assert sorted(versions.TESTED) == sorted(r.version for r in RELEASES.values())


def test_the_pinned_image_is_the_servers_exact_version() -> None:
    assert versions.scheduler_image(KubeVersion.parse("v1.30.4-eks-a737599")) == (
        "registry.k8s.io/kube-scheduler:v1.30.4"
    )
