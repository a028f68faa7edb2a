"""Topology profiles (apis/topology_profile.py) and the levels gangs ask for
(apis/topology_constraint.py): presets, detection from node labels, and every way a wish is read
or refused."""

from __future__ import annotations

import pytest

from apis import keys
from apis.errors import CodecError
from apis.topology_constraint import (
    TopologyWish,
    annotated_topology,
    group_topology,
    native_topology,
)
from apis.topology_profile import (
    CUSTOM,
    GENERIC,
    PRESETS,
    custom,
    detect,
    profile_named,
    resolve,
)

DEFAULT = GENERIC.keys


def test_presets_list_their_levels_narrowest_first() -> None:
    assert PRESETS["topograph"].keys == (
        "nvidia.com/gpu.clique",
        "accelerator.topograph.run/domain",
        "fabric.topograph.run/tier-0",
        "fabric.topograph.run/tier-1",
        "fabric.topograph.run/tier-2",
    )
    assert PRESETS["topograph-legacy"].keys[2:] == (
        "network.topology.nvidia.com/leaf",
        "network.topology.nvidia.com/spine",
        "network.topology.nvidia.com/core",
    )
    assert PRESETS["aws"].keys == (
        "topology.k8s.aws/network-node-layer-3",
        "topology.k8s.aws/network-node-layer-2",
        "topology.k8s.aws/network-node-layer-1",
    )
    assert PRESETS["gke"].keys == (
        "cloud.google.com/gce-topology-host",
        "cloud.google.com/gce-topology-subblock",
        "cloud.google.com/gce-topology-block",
    )
    assert GENERIC.keys == ("nvidia.com/gpu.clique", "topoalloc.io/rack", "topology.kubernetes.io/zone")


def test_a_level_is_found_by_its_key_or_its_name() -> None:
    p = PRESETS["topograph"]
    assert p.index("leaf") == 2 and p.index("fabric.topograph.run/tier-0") == 2
    assert p.key_of("spine") == "fabric.topograph.run/tier-1"
    assert p.key_of("example.com/pod") == "example.com/pod" and p.index("example.com/pod") is None
    assert p.name_of("fabric.topograph.run/tier-2") == "core"


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"fabric.topograph.run/tier-0": "s1", "topology.kubernetes.io/zone": "z"}, "topograph"),
        ({"accelerator.topograph.run/domain": "nvl1"}, "topograph"),
        ({"network.topology.nvidia.com/leaf": "s1", "nvidia.com/gpu.clique": "c.1"}, "topograph-legacy"),
        ({"topology.k8s.aws/network-node-layer-3": "nn-3", "topology.kubernetes.io/zone": "z"}, "aws"),
        ({"cloud.google.com/gce-topology-block": "b1"}, "gke"),
        ({"topoalloc.io/rack": "r1"}, "generic"),
        # Only labels every cloud or GPU node has: nothing to tell, the generic levels.
        ({"topology.kubernetes.io/zone": "z", "nvidia.com/gpu.clique": "c.1"}, "generic"),
    ],
)
def test_detection_picks_the_preset_whose_own_labels_the_nodes_carry(
    labels: dict[str, str], expected: str
) -> None:
    got = detect([labels, {}])
    assert got.profile.name == expected and got.total == 2
    assert got.nodes == (0 if expected == "generic" and "topoalloc.io/rack" not in labels else 1)


def test_detection_follows_the_most_nodes() -> None:
    aws = {"topology.k8s.aws/network-node-layer-1": "a"}
    gke = {"cloud.google.com/gce-topology-block": "b"}
    assert detect([aws, gke, gke]).profile.name == "gke"
    assert detect([aws, gke]).profile.name == "aws"  # a tie goes to the first preset listed


def test_resolve_honours_a_named_preset_a_custom_list_and_keys_a_user_set() -> None:
    topograph = [{"fabric.topograph.run/tier-0": "s"}]
    assert resolve("auto", DEFAULT, DEFAULT, topograph).profile.name == "topograph"
    assert resolve("gke", DEFAULT, DEFAULT, topograph).profile.name == "gke"
    mine = resolve("auto", ["example.com/rack"], DEFAULT, topograph).profile
    assert mine == custom(["example.com/rack"]) and mine.name == CUSTOM and mine.levels[0].name == "rack"
    assert resolve(CUSTOM, DEFAULT, DEFAULT, topograph).profile.keys == DEFAULT
    with pytest.raises(ValueError, match="unknown topology profile 'azure' \\(known: auto, topograph, "):
        profile_named("azure")


# -- wishes -----------------------------------------------------------------------------------------


def test_native_podgroup_topology_is_a_required_level() -> None:
    pg = {"spec": {"schedulingConstraints": {"topology": [{"key": "topoalloc.io/rack"}]}}}
    assert native_topology(pg, "PodGroup a/b") == TopologyWish(
        required="topoalloc.io/rack", source="PodGroup a/b"
    )
    assert native_topology({"spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}}) is None
    with pytest.raises(
        CodecError, match=r"spec\.schedulingConstraints\.topology\[0\]\.key: expected a node label"
    ):
        native_topology({"spec": {"schedulingConstraints": {"topology": [{"key": ""}]}}})
    with pytest.raises(CodecError, match="is not a valid label key"):
        native_topology({"spec": {"schedulingConstraints": {"topology": [{"key": "a b"}]}}})


def test_annotations_topoalloc_first_then_kueue() -> None:
    assert annotated_topology({keys.REQUIRED_TOPOLOGY: "leaf"}) == TopologyWish(required="leaf")
    assert annotated_topology({keys.PREFERRED_TOPOLOGY: " rack "}) == TopologyWish(preferred="rack")
    kueue = {keys.KUEUE_REQUIRED_TOPOLOGY: "cloud.google.com/gce-topology-block"}
    assert annotated_topology(kueue, "pod a/b") == TopologyWish(
        required="cloud.google.com/gce-topology-block", source="pod a/b"
    )
    both = {**kueue, keys.PREFERRED_TOPOLOGY: "leaf"}
    assert annotated_topology(both) == TopologyWish(preferred="leaf")
    assert annotated_topology({keys.KUEUE_UNCONSTRAINED_TOPOLOGY: "true"}) == TopologyWish()
    assert annotated_topology({"other": "x"}) is None


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({keys.REQUIRED_TOPOLOGY: "leaf", keys.PREFERRED_TOPOLOGY: "rack"}, "give one of"),
        ({keys.KUEUE_REQUIRED_TOPOLOGY: "a", keys.KUEUE_PREFERRED_TOPOLOGY: "b"}, "give one of"),
        ({keys.REQUIRED_TOPOLOGY: ""}, "expected a node label key or a topology level's name"),
        ({keys.PREFERRED_TOPOLOGY: "not a key!"}, "is not a valid label key"),
    ],
)
def test_a_malformed_wish_is_refused_naming_the_annotation(annotations: dict[str, str], message: str) -> None:
    with pytest.raises(CodecError, match=message) as err:
        annotated_topology(annotations)
    assert err.value.field in annotations


def test_a_group_s_wish_comes_from_the_podgroup_first_then_the_oldest_member() -> None:
    members = [
        ("ns/w0", {}),
        ("ns/w1", {keys.REQUIRED_TOPOLOGY: "leaf"}),
        ("ns/w2", {keys.PREFERRED_TOPOLOGY: "x"}),
    ]
    assert group_topology(members) == TopologyWish(required="leaf", source="pod ns/w1")
    annotated = group_topology(members, {keys.PREFERRED_TOPOLOGY: "spine"}, "ns/g")
    assert annotated == TopologyWish(preferred="spine", source="PodGroup ns/g")
    native = {"spec": {"schedulingConstraints": {"topology": [{"key": "zone"}]}}}
    assert group_topology(members, {keys.PREFERRED_TOPOLOGY: "spine"}, "ns/g", native) == TopologyWish(
        required="zone", source="PodGroup ns/g"
    )
    assert group_topology([("ns/w0", {})]) is None
    bad = [*members, ("ns/w3", {keys.REQUIRED_TOPOLOGY: "a b"})]
    with pytest.raises(CodecError, match=f"pod ns/w3: {keys.REQUIRED_TOPOLOGY}: is not a valid label key"):
        group_topology(bad)
