"""The tier really runs on each release it names: kube-apiserver, kube-scheduler and
kube-controller-manager of that version, serving the APIs the product relies on."""

from __future__ import annotations

from tests.cluster.harness import ClusterEnv
from tests.support.kube_releases import KubeRelease


def test_control_plane_runs_the_release(cluster: ClusterEnv, release: KubeRelease) -> None:
    assert cluster.cp.admin.get("/version")["gitVersion"] == release.version
    for name in ("kube-scheduler", "kube-controller-manager"):
        binary = cluster.cp.processes[name].argv[0]
        assert str(release.cache) in binary, (name, binary)


def test_served_apis_the_product_uses(cluster: ClusterEnv, release: KubeRelease) -> None:
    groups = {
        g["name"]: [v["version"] for v in g["versions"]] for g in cluster.cp.admin.get("/apis")["groups"]
    }
    assert "v1" in groups["resource.k8s.io"]  # DRA, GA since 1.34
    assert "v1alpha1" in groups["scheduling.koordinator.sh"]  # our CRDs applied
    assert "v1" in groups["policy"]
