"""The tier really runs on each release it names: kube-apiserver, kube-scheduler and
kube-controller-manager of that version, serving the APIs the product relies on."""

from __future__ import annotations

import pytest

from tests.cluster.harness import ClusterEnv
from tests.support.kube_releases import REPO, KubeRelease


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


def test_the_native_gang_api_each_release_serves_with_its_gates(
    cluster: ClusterEnv, release: KubeRelease
) -> None:
    """The tier turns on the alpha gang gates: 1.36 serves v1alpha2 PodGroups and Workloads (and no
    v1alpha1), 1.35 v1alpha1 Workloads (the gang scenarios show the allocator found which: test_gangs.py)."""
    found = cluster.cp.admin.get(f"/apis/{release.gang_api}")
    plurals = {r["name"] for r in found["resources"] if "/" not in r["name"]}
    assert plurals == ({"podgroups", "workloads"} if release.minor_int >= 36 else {"workloads"})
    groups = {g["name"]: g for g in cluster.cp.admin.get("/apis")["groups"]}
    versions = [v["version"] for v in groups["scheduling.k8s.io"]["versions"]]
    assert versions == ["v1", release.gang_api.split("/")[1]], versions


# The gang examples and the minors whose API they use (examples/gangs, docs/gang.md).
GANG_EXAMPLES = {
    "podgroup-scheduler-plugins.yaml": ("1.35", "1.36"),
    "podgroup-native.yaml": ("1.36",),
    "indexed-job.yaml": ("1.35", "1.36"),  # a plain Indexed Job on 1.35: no gang there
    "workload-1.35.yaml": ("1.35",),
}


@pytest.mark.parametrize("example", sorted(GANG_EXAMPLES))
def test_gang_examples_apply_where_their_api_is_served(
    cluster: ClusterEnv, release: KubeRelease, ns: str, example: str
) -> None:
    path = REPO / "examples" / "gangs" / example
    # Applied for real (a dry run checks each object alone: a PodGroup naming its Workload is refused).
    done = cluster.cp.kubectl("apply", "-n", ns, "-f", str(path), check=False)
    if release.minor in GANG_EXAMPLES[example]:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0 and "no matches for kind" in done.stderr, done.stderr
