"""Topology levels outside the planner: pods of an RL job group placed one by one keep to their
siblings' domain of a required level (allocator/gang/steering.py), the gang view carries the
levels a gang asks for (allocator/gang/plan_inputs.py), and the profile follows the Nodes
(allocator/gang/topology.py)."""

from __future__ import annotations

from typing import Any

import pytest

from allocator.gang.holds import PlanHolds
from allocator.gang.index import GangIndex
from allocator.gang.plan_inputs import gang_view
from allocator.gang.steering import GangSteering
from allocator.runtime.config import ServiceConfig
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.gang_settings import GangSettings
from allocator.runtime.topology import Topology
from apis import keys
from tests.gang.fakes import FakeGangCache
from tests.support.allocator_harness import device, node, pod

LEAF = "network.topology.nvidia.com/leaf"
LEAFS = {"n1": "L1", "n2": "L1", "n3": "L2", "n4": ""}


def rig(profile: str = "auto") -> tuple[FakeGangCache, CoreAdapter, GangIndex, GangSteering]:
    cache, core, index = FakeGangCache(), CoreAdapter(), GangIndex()
    for name, leaf in LEAFS.items():
        n = node(name, labels={LEAF: leaf} if leaf else {})
        cache.add_node(n)
        core.set_node(n)
        core.set_device(device(name))
    settings = GangSettings(topology_profile=profile)
    steering = GangSteering(core, PlanHolds(cache.ledger), index, settings, Topology(settings, cache))
    return cache, core, index, steering


def worker(name: str, annotations: dict[str, str] | None = None, **labels: str) -> dict[str, Any]:
    p = pod(name, gpus=1, annotations=annotations)
    p["metadata"]["uid"] = f"uid-{name}"
    p["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:0{name[-1]}Z"
    p["metadata"]["labels"] = {keys.RL_JOB_GROUP: "ppo", **labels}
    return p


def bind(core: CoreAdapter, index: GangIndex, p: dict[str, Any], where: str) -> None:
    p["spec"]["nodeName"] = where
    index.update(f"default/{p['metadata']['name']}", p)
    core.assign_usage(f"default/{p['metadata']['name']}", where, core.usage(p))


def test_a_job_group_requiring_a_leaf_keeps_to_its_siblings_leaf() -> None:
    _, core, index, steering = rig()
    master = worker("m0", {keys.REQUIRED_TOPOLOGY: "leaf"})
    index.update("default/m0", master)
    w1 = worker("w1")
    index.update("default/w1", w1)
    names = list(LEAFS)
    # Nothing placed yet: any node carrying the leaf label.
    got = steering.job_group_filter(core.request(w1), names)
    assert got is not None and got.passed == ["n1", "n2", "n3"]
    assert got.failed == {"n4": f"rl-job-group default/ppo needs the node label {LEAF}"}
    # The master lands on n3 (L2): the worker keeps to L2, and the core still checks n3 itself.
    bind(core, index, master, "n3")
    got = steering.job_group_filter(core.request(w1), names)
    assert got is not None and got.passed == ["n3"]
    off = f"rl-job-group default/ppo keeps to {LEAF}=L2"
    assert got.failed == {"n1": off, "n2": off, "n4": off} and got.codes["TopologyLevel"] == 3


def test_no_bound_without_a_required_level_or_for_gang_members() -> None:
    _, core, index, steering = rig()
    for name, notes in (("m0", {keys.PREFERRED_TOPOLOGY: "leaf"}), ("w1", None)):
        index.update(f"default/{name}", worker(name, notes))
    assert steering.job_group_filter(core.request(worker("w1")), list(LEAFS)) is None
    member = worker("w2", {keys.REQUIRED_TOPOLOGY: "leaf"}, **{keys.POD_GROUP_LABEL: "g"})
    index.update("default/w2", member)
    assert steering.job_group_filter(core.request(member), list(LEAFS)) is None


def test_a_job_group_wish_that_does_not_decode_is_every_node_s_reason() -> None:
    _, core, index, steering = rig()
    bad = worker("m0", {keys.KUEUE_REQUIRED_TOPOLOGY: "not a key"})
    index.update("default/m0", bad)
    got = steering.job_group_filter(core.request(bad), ["n1", "n2"])
    assert got is not None and got.passed == [] and set(got.unresolvable) == {"n1", "n2"}
    assert got.unresolvable["n1"].startswith(
        f"rl-job-group default/ppo: topology: pod default/m0: {keys.KUEUE_REQUIRED_TOPOLOGY}: is not a valid"
    )


def test_the_gang_view_carries_the_levels_its_podgroup_asks_for() -> None:
    cache, _, index, _ = rig()
    settings = GangSettings()
    topology = Topology(settings, cache)
    for name in ("w0", "w1"):
        index.update(f"default/{name}", worker(name, **{keys.POD_GROUP_LABEL: "g"}))
    cache.podgroups["default/g"] = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "g", "namespace": "default", "annotations": {keys.REQUIRED_TOPOLOGY: "spine"}},
        "spec": {"minMember": 2},
    }
    view = gang_view(index, cache, settings, "default/g", topology=topology)
    assert view.levels is not None and view.levels.required
    assert (
        view.levels.top == "network.topology.nvidia.com/spine" and view.levels.source == "PodGroup default/g"
    )
    assert not view.problem
    cache.podgroups["default/g"]["metadata"]["annotations"] = {keys.REQUIRED_TOPOLOGY: "a b"}
    bad = gang_view(index, cache, settings, "default/g", topology=topology)
    assert bad.levels is None and bad.problem_code == "InvalidTopology"
    assert bad.problem.startswith(f"topology: {keys.REQUIRED_TOPOLOGY}: is not a valid label key")


def test_the_gang_view_reads_a_native_podgroups_own_level_and_a_workloads_annotation() -> None:
    """A LIST's items carry no apiVersion: the gang's source says the object is a native PodGroup,
    whose spec.schedulingConstraints states a required level; a 1.35 Workload states one by
    topoalloc's annotation on it."""
    cache, _, index, _ = rig()
    settings = GangSettings()
    topology = Topology(settings, cache)
    for name in ("w0", "w1"):
        p = worker(name)
        p["spec"]["schedulingGroup"] = {"podGroupName": "ng"}
        index.update(f"default/{name}", p)
    cache.native_podgroups["default/ng"] = {  # as a LIST item: no apiVersion, no kind
        "metadata": {"name": "ng", "namespace": "default"},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 2}},
            "schedulingConstraints": {"topology": [{"key": LEAF}]},
        },
    }
    view = gang_view(index, cache, settings, "default/ng", topology=topology)
    assert not view.problem and view.min_member == 2
    assert view.levels is not None and view.levels.required and view.levels.top == LEAF
    assert view.levels.source == "PodGroup default/ng"
    for name in ("v0", "v1"):
        p = worker(name)
        p["spec"]["workloadRef"] = {"name": "wl", "podGroup": "workers"}
        index.update(f"default/{name}", p)
    cache.workloads["default/wl"] = {
        "apiVersion": "scheduling.k8s.io/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "wl", "namespace": "default", "annotations": {keys.REQUIRED_TOPOLOGY: "leaf"}},
        "spec": {"podGroups": [{"name": "workers", "policy": {"gang": {"minCount": 2}}}]},
    }
    key = next(k for k in index.by_gang if k.startswith("default/wl"))
    wl = gang_view(index, cache, settings, key, topology=topology)
    assert not wl.problem and wl.min_member == 2
    assert wl.levels is not None and wl.levels.required and wl.levels.top == LEAF


def test_the_profile_is_detected_again_when_the_nodes_change() -> None:
    cache, _, _, steering = rig()
    topology = steering.topology
    assert topology.profile.name == "topograph-legacy" and topology.detected.nodes == 3
    for name in LEAFS:
        cache.add_node(node(name, labels={"cloud.google.com/gce-topology-block": "b1"}))
    assert topology.profile.name == "topograph-legacy"  # not told yet
    topology.nodes_changed()
    assert topology.profile.name == "gke"
    fixed = Topology(GangSettings(topology_profile="aws"), cache)
    assert fixed.profile.name == "aws"


def test_the_config_names_the_profile_and_refuses_an_unknown_one() -> None:
    cfg = ServiceConfig.from_mapping({"gang": {"topologyProfile": "gke"}})
    assert cfg.gang.topology_profile == "gke" and ServiceConfig().gang.topology_profile == "auto"
    with pytest.raises(ValueError, match=r"gang\.topologyProfile: unknown profile 'azure' \(known: auto, "):
        ServiceConfig.from_mapping({"gang": {"topologyProfile": "azure"}})
    assert ServiceConfig().updated(gang_topology_profile="custom").gang.topology_profile == "custom"
