"""Topology levels on a real control plane (docs/topology.md): four DGX H100 nodes, two in leaf
L1, one in L2 (both under spine S1, zone z1) and one in L3 (spine S2, zone z2), labelled as NVIDIA
Topograph labels them; the allocator detects the profile from the labels by itself.

* an RL job group (a master and workers, `rl-job-group`) placed pod by pod lands on one node
  while it fits, then in its leaf, then its spine, and never in another zone when the zone is
  required: the next worker waits, saying why, though the other zone's node is empty;
* a 2 x 8 gang with a required leaf (Kueue's annotation) waits rather than straddle two leafs,
  saying the level and the leafs tried, and binds when a leaf frees;
* with each preset's labels on the nodes (relabelled in turn), a gang asking for a level by its
  name in that preset is placed inside one domain of it, and `topoalloc topology` shows the
  preset detected."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from apis import keys
from apis.topology_profile import PRESETS, ZONE
from tests.cluster.harness import ClusterEnv, gpu_pod
from tests.support.controlplane import ApiStatus, wait_until
from topoalloc.cli import main

POOL = {"topoalloc.test/pool": "topology"}
PIN = "topoalloc.test/node"
PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"
CONTROLLER = "topoalloc.io/allocator"
LEGACY = PRESETS["topograph-legacy"]
LEAF, SPINE = LEGACY.key_of("leaf"), LEGACY.key_of("spine")
# node -> (leaf, spine, zone)
PLACES = {"topo-a1": ("L1", "S1", "z1"), "topo-a2": ("L1", "S1", "z1"), "topo-b1": ("L2", "S1", "z1")}
PLACES["topo-c1"] = ("L3", "S2", "z2")
EVERY_KEY = sorted({k for p in PRESETS.values() for k in p.keys} | {ZONE})


def relabel(cluster: ClusterEnv, labels: dict[str, dict[str, str]]) -> None:
    """Each node's topology labels replaced by `labels[node]` (every preset's keys removed first)."""
    for name, mine in labels.items():
        patch: dict[str, Any] = dict.fromkeys(EVERY_KEY)
        patch.update(mine)
        cluster.cp.admin.merge_patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": patch}})


def legacy_labels() -> dict[str, dict[str, str]]:
    return {n: {LEAF: leaf, SPINE: spine, ZONE: zone} for n, (leaf, spine, zone) in PLACES.items()}


@pytest.fixture(scope="module", autouse=True)
def nodes(cluster: ClusterEnv) -> Iterator[None]:
    for name in PLACES:
        cluster.add_node(name, "dgx-h100", gpus=8, labels={**POOL, PIN: name})
    relabel(cluster, legacy_labels())
    for name in PLACES:
        cluster.wait_device(name)
    yield
    for name in PLACES:
        cluster.remove_node(name)


def node_of(cluster: ClusterEnv, ns: str, name: str) -> str:
    return str(cluster.wait_bound(ns, name)["spec"]["nodeName"])


def podgroup(
    cluster: ClusterEnv, ns: str, name: str, size: int, annotations: dict[str, str] | None = None
) -> None:
    body = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"minMember": size},
    }
    cluster.cp.admin.post(PODGROUPS.format(ns=ns), body)


def member(name: str, group: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {keys.POD_GROUP_LABEL: group}
    return gpu_pod(name, gpus=8, labels=labels, annotations=annotations, node_selector=POOL)


def gang_events(cluster: ClusterEnv, ns: str, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in cluster.events(ns)
        if e.get("reportingComponent") == CONTROLLER
        and e["reason"] == reason
        and e["involvedObject"]["kind"] == "PodGroup"
    ]


def test_an_rl_job_group_packs_node_then_leaf_then_spine_and_never_leaves_its_zone(
    cluster: ClusterEnv, ns: str
) -> None:
    wish = {keys.REQUIRED_TOPOLOGY: ZONE}
    group = {keys.RL_JOB_GROUP: "ppo"}

    def pod(name: str, pin: str | None = None) -> dict[str, Any]:
        where = {**POOL, PIN: pin} if pin else POOL
        return gpu_pod(name, gpus=2, labels=group, annotations=wish, node_selector=where)

    cluster.create_pod(ns, pod("master", pin="topo-a1"))
    assert node_of(cluster, ns, "master") == "topo-a1"
    # One at a time, as a job group's pods are scheduled: each sees where its siblings went.
    expected = ["topo-a1"] * 3 + ["topo-a2"] * 4 + ["topo-b1"] * 4
    for i, where in enumerate(expected, start=1):
        cluster.create_pod(ns, pod(f"w{i}"))
        assert node_of(cluster, ns, f"w{i}") == where, f"w{i}"
    # Zone z1 is full; topo-c1 (zone z2) is empty, but the group requires its zone: w12 waits.
    cluster.create_pod(ns, pod("w12"))
    message = cluster.wait_pending_reason(ns, "w12", f"keeps to {ZONE}=z1")
    assert "rl-job-group" in message, message


def test_a_gang_requiring_a_leaf_waits_rather_than_straddle_and_binds_when_a_leaf_frees(
    cluster: ClusterEnv, ns: str
) -> None:
    cluster.create_pod(ns, gpu_pod("filler", gpus=8, node_selector={**POOL, PIN: "topo-a2"}))
    assert node_of(cluster, ns, "filler") == "topo-a2"
    # Free: topo-a1 (L1), topo-b1 (L2), topo-c1 (L3): room for 2 x 8 only across leafs.
    podgroup(cluster, ns, "pair", 2)
    kueue = {keys.KUEUE_REQUIRED_TOPOLOGY: LEAF}
    for name in ("m0", "m1"):
        cluster.create_pod(ns, member(name, "pair", kueue))
    [waiting] = wait_until(
        lambda: [e for e in gang_events(cluster, ns, "GangWaiting") if "required leaf" in e["message"]],
        timeout=60,
        what="a GangWaiting Event naming the required leaf",
    )
    note = waiting["message"]
    assert f"required leaf ({LEAF}): no leaf holds all 2 members (tried " in note, note
    assert all(f"{leaf}: " in note for leaf in ("L1", "L2", "L3")), note
    assert all(not cluster.pod(ns, n)["spec"].get("nodeName") for n in ("m0", "m1"))
    # L1 frees: both members bind there, together.
    cluster.cp.admin.delete(f"/api/v1/namespaces/{ns}/pods/filler", gracePeriodSeconds=0)
    assert sorted(node_of(cluster, ns, n) for n in ("m0", "m1")) == ["topo-a1", "topo-a2"]
    [planned] = wait_until(lambda: gang_events(cluster, ns, "GangPlanned"), timeout=30, what="GangPlanned")
    assert f"({LEAF}=L1)" in planned["message"], planned["message"]


def gone(cluster: ClusterEnv, ns: str, names: list[str]) -> bool:
    for name in names:
        try:
            cluster.pod(ns, name)
        except ApiStatus:
            continue
        return False
    return True


@pytest.mark.parametrize("preset", list(PRESETS))
def test_each_preset_s_labels_are_detected_and_kept_to(cluster: ClusterEnv, ns: str, preset: str) -> None:
    profile = PRESETS[preset]
    domain, top = profile.levels[-2], profile.levels[-1]
    relabel(
        cluster,
        {n: {domain.key: f"d-{leaf}", top.key: "t1"} for n, (leaf, _, _) in PLACES.items()},
    )
    try:
        shown = wait_until(
            lambda: (
                (
                    out := CliRunner().invoke(
                        main, ["topology", "--kubeconfig", str(cluster.cp.admin_kubeconfig)]
                    )
                )
                and out.output.startswith(f"profile {preset} (detected: 4 of ")
                and out.output
            ),
            timeout=30,
            what=f"topoalloc topology showing {preset}",
        )
        assert f"{domain.name} d-L1" in shown, shown
        # The level asked for by its name in the preset: only the detected profile resolves it.
        podgroup(cluster, ns, "pair", 2, {keys.REQUIRED_TOPOLOGY: domain.name})
        for name in ("m0", "m1"):
            cluster.create_pod(ns, member(name, "pair"))
        assert sorted(node_of(cluster, ns, n) for n in ("m0", "m1")) == ["topo-a1", "topo-a2"]
        [planned] = wait_until(
            lambda: gang_events(cluster, ns, "GangPlanned"), timeout=30, what="GangPlanned"
        )
        assert f"({domain.key}=d-L1)" in planned["message"], planned["message"]
    finally:
        cluster.delete_pods(ns)
        wait_until(lambda: gone(cluster, ns, ["m0", "m1"]), timeout=30, what="the gang's pods deleted")
        relabel(cluster, legacy_labels())
