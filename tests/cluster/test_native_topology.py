"""The native PodGroup's topology constraint as a v1.36 kube-apiserver serves it (alpha gates
GenericWorkload, GangScheduling and TopologyAwareWorkloadScheduling, scheduling.k8s.io/v1alpha2
on): what the server stores is what apis/topology_constraint.py reads, and it refuses a second
constraint as the reader assumes. Its own kube-apiserver (no scheduler): the tier's shared
control plane runs with the default gates."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.runtime.cache.records import NodeFacts
from allocator.runtime.gang_settings import GangSettings
from allocator.runtime.topology import Topology
from apis.topology_constraint import TopologyWish, native_topology
from tests.apis.paths import require_shared
from tests.gang.fakes import FakeGangCache
from tests.support.controlplane import ApiStatus, ControlPlane
from tests.support.kube_releases import KubeRelease

GATES = "GenericWorkload=true,GangScheduling=true,TopologyAwareWorkloadScheduling=true"
PODGROUPS = "/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/podgroups"
LEAF = "network.topology.nvidia.com/leaf"


@pytest.fixture(scope="module")
def gated(release: KubeRelease, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if release.minor_int < 36:
        pytest.skip(f"the native PodGroup's topology needs Kubernetes 1.36, this run is {release.version}")
    require_shared(release.missing_parts())
    args = (f"--feature-gates={GATES}", "--runtime-config=scheduling.k8s.io/v1alpha2=true")
    with ControlPlane(
        Path(tmp_path_factory.mktemp("native-topology")),
        scheduler=False,
        release=release,
        apiserver_args=args,
    ) as cp:
        cp.create_namespace("team")
        yield cp


def podgroup(name: str, *keys_: str) -> dict[str, object]:
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 2}},
            "schedulingConstraints": {"topology": [{"key": k} for k in keys_]},
        },
    }


@pytest.mark.k8s(min="1.36")
def test_the_served_constraint_is_the_required_level_read(gated: ControlPlane) -> None:
    gated.admin.post(PODGROUPS.format(ns="team"), podgroup("pair", LEAF))
    stored = gated.admin.get(f"{PODGROUPS.format(ns='team')}/pair")
    assert stored["spec"]["schedulingConstraints"] == {"topology": [{"key": LEAF}]}
    assert native_topology(stored, "PodGroup team/pair") == TopologyWish(
        required=LEAF, source="PodGroup team/pair"
    )
    # The allocator's view: the native PodGroup's own field, resolved in the detected profile.
    cache = FakeGangCache()
    cache.nodes["n1"] = NodeFacts({LEAF: "L1"}, {}, {})
    levels = Topology(GangSettings(), cache).levels_for([], stored, "team/pair")
    assert levels is not None and levels.required and levels.top == LEAF and levels.names[-1] == "leaf"


@pytest.mark.k8s(min="1.36")
def test_the_server_refuses_a_second_constraint(gated: ControlPlane) -> None:
    with pytest.raises(ApiStatus) as refused:
        gated.admin.post(PODGROUPS.format(ns="team"), podgroup("two", LEAF, "topology.kubernetes.io/zone"))
    assert refused.value.status == 422 and "must have at most 1 item" in refused.value.message
