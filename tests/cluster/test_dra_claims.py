"""Claims allocated by topoalloc on the real control plane (kube-apiserver, kube-scheduler,
kube-controller-manager's resourceclaim controller), on a DGX-1 and a DGX H100 in dra mode whose agents
publish their pools and whose stand-in kubelets prepare claims through the agents' DRA plugins:
the webhook gates the pod, the allocator writes each claim's allocation exactly as the core chooses
and ungates it, kube-scheduler binds it there, the plugin prepares exactly those devices. NVLink
pairs stay intact where kube-scheduler's first fit breaks them on the same node state; every GPU
gets the NIC behind its switch; a pod kube-scheduler cannot place on the node its claims were
allocated on is allocated elsewhere, and one bound all the same to the node its claim moved from
is evicted; claims kube-scheduler allocated count as used; one node is in
one mode; bad claims say why and nothing is written; a gang of claims, however the gang is defined, is
allocated whole or not at all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from apis import dra
from tests.cluster.dra import DraNode, running_dra_nodes, start_dra_node
from tests.cluster.dra_claims import (
    EXAMPLES,
    OPT_OUT,
    allocated_claim,
    cache_of,
    claim_of,
    claim_pod,
    cleanup,
    core_answer,
    create_template,
    event_notes,
    example,
    gates,
    gpu_template,
    node_of,
    results,
)
from tests.cluster.gang_sources import NATIVE, SCHEDULER_PLUGINS, WORKLOAD, GangSource, gang_sources
from tests.cluster.harness import ClusterEnv, gpu_pod
from tests.support.controlplane import wait_until

A, B = "dra-a", "dra-b"
PAIR2 = "nvlinkPartition2"
SWITCH = "pcieSwitch"


@pytest.fixture(scope="module")
def nodes(cluster: ClusterEnv) -> Iterator[dict[str, DraNode]]:
    started = {A: start_dra_node(cluster, A, "dgx1-v100"), B: start_dra_node(cluster, B, "dgx-h100")}
    # The allocator's cache has both pools once it can allocate there.
    with running_dra_nodes(cluster, started) as running:
        yield running


def attrs(cluster: ClusterEnv, node: str) -> dict[str, dict[str, object]]:
    cache = cache_of(cluster)
    return {name: dict(d.attributes) for name, d in cache.dra.published[node].devices.items()}


def value(table: dict[str, dict[str, object]], device: str, name: str) -> object:
    return table[device].get(f"{dra.DRIVER}/{name}")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_each_example_is_allocated_as_the_core_chooses_and_prepared(
    cluster: ClusterEnv, nodes: dict[str, DraNode], ns: str, path: Path
) -> None:
    template, pod = example(path, ns)
    name = pod["metadata"]["name"]
    cache = cache_of(cluster)  # the cluster as it is before: what the core would choose on each node
    devices = template["spec"]["spec"]["devices"]
    expected = {n: core_answer(cache, n, devices, pod) for n in (A, B)}  # None: cannot there
    create_template(cluster, template)
    created = cluster.create_pod(ns, pod)
    assert dra.SCHEDULING_GATE in [g["name"] for g in created["spec"]["schedulingGates"]]
    bound = cluster.wait_bound(ns, name)
    claim = allocated_claim(cluster, ns, name)
    node = node_of(claim)
    assert bound["spec"]["nodeName"] == node
    assert claim["metadata"]["annotations"][dra.ALLOCATED_BY_ANNOTATION] == dra.ALLOCATED_BY
    answer = expected[node]
    assert answer is not None, f"allocated on {node}, where the core refuses it"
    want = [(r.request, r.device) for r in answer.results["c"]]
    assert results(claim) == want
    assert claim["status"]["reservedFor"][0]["name"] == name  # kube-scheduler reserved it and bound
    bound = wait_until(
        lambda: (p := cluster.pod(ns, name))["status"].get("resourceClaimStatuses") and p,
        timeout=30,
        what="the pod's resourceClaimStatuses",
    )
    uid = claim["metadata"]["uid"]
    got = nodes[node].kubelet.prepare(bound)
    assert got == {bound["spec"]["containers"][0]["name"]: [f"topoalloc.io/claim={uid}-{d}" for _, d in want]}
    nodes[node].kubelet.unprepare(bound)
    cleanup(cluster, ns)


def test_nvlink_pairs_stay_intact_where_first_fit_breaks_them(
    cluster: ClusterEnv, nodes: dict[str, DraNode], ns: str
) -> None:
    table = attrs(cluster, A)
    # kube-scheduler's own allocation (the claim opts out) of two GPUs on the empty node.
    create_template(cluster, gpu_template("theirs", 2, ns, annotations=OPT_OUT))
    cluster.create_pod(ns, claim_pod("first-fit", "theirs", ns, node=A))
    assert gates(cluster, ns, "first-fit") == []
    cluster.wait_bound(ns, "first-fit")
    theirs = [d for _, d in results(allocated_claim(cluster, ns, "first-fit"))]
    assert value(table, theirs[0], PAIR2) != value(table, theirs[1], PAIR2), theirs  # a pair broken
    cleanup(cluster, ns)
    # The same two GPUs asked of topoalloc, on the same (empty) node: an NVLink pair.
    create_template(cluster, gpu_template("ours", 2, ns))
    cluster.create_pod(ns, claim_pod("by-topology", "ours", ns, node=A))
    cluster.wait_bound(ns, "by-topology")
    ours = [d for _, d in results(allocated_claim(cluster, ns, "by-topology"))]
    assert value(table, ours[0], PAIR2) == value(table, ours[1], PAIR2), ours
    cleanup(cluster, ns)


def test_every_gpu_gets_the_nic_behind_its_switch(
    cluster: ClusterEnv, nodes: dict[str, DraNode], ns: str
) -> None:
    template, pod = example(EXAMPLES[0].parent / "gpu-nic-x4.yaml", ns)
    create_template(cluster, template)
    cluster.create_pod(ns, pod)
    name = pod["metadata"]["name"]
    cluster.wait_bound(ns, name)
    claim = allocated_claim(cluster, ns, name)
    table = attrs(cluster, node_of(claim))
    devices = dict(results(claim))
    for i in range(4):
        assert value(table, devices[f"gpu-{i}"], SWITCH) == value(table, devices[f"nic-{i}"], SWITCH)
    assert len({value(table, devices[f"gpu-{i}"], SWITCH) for i in range(4)}) == 4
    cleanup(cluster, ns)


def test_refused_by_kube_scheduler_on_its_node_the_pod_is_allocated_elsewhere(
    cluster: ClusterEnv, nodes: dict[str, DraNode], ns: str
) -> None:
    # The pod needs an extended resource no node has yet: the allocator does not judge it (it is
    # kube-scheduler's NodeResourcesFit), so it allocates the claim, and kube-scheduler refuses.
    create_template(cluster, gpu_template("one", 1, ns))
    cluster.create_pod(ns, claim_pod("p", "one", ns, requests={"example.com/dongle": "1"}))
    # kube-scheduler refuses the node the claim was allocated on; the claim moves at once.
    (note,) = wait_until(
        lambda: event_notes(cluster, ns, "DRAReallocated"), timeout=60, what="the claim moved, with an Event"
    )
    first = A if note.index(A) < note.index(B) else B
    other = B if first == A else A
    assert note.startswith(f"kube-scheduler could not place the pod on {first}") and note.endswith(other)
    assert node_of(allocated_claim(cluster, ns, "p")) == other
    dongle = {"capacity": {"example.com/dongle": "1"}, "allocatable": {"example.com/dongle": "1"}}
    cluster.cp.admin.merge_patch(f"/api/v1/nodes/{other}/status", {"status": dongle})
    try:
        assert cluster.wait_bound(ns, "p", timeout=60)["spec"]["nodeName"] == other
        assert node_of(allocated_claim(cluster, ns, "p")) == other
    finally:
        cleanup(cluster, ns)
        gone = {"capacity": {"example.com/dongle": None}, "allocatable": {"example.com/dongle": None}}
        cluster.cp.admin.merge_patch(f"/api/v1/nodes/{other}/status", {"status": gone})


def test_a_pod_bound_to_the_node_its_claim_moved_from_is_evicted(
    cluster: ClusterEnv, nodes: dict[str, DraNode], ns: str
) -> None:
    # kube-scheduler refuses the pod (an extended resource no node has) and its claim moves; a
    # scheduling attempt that began before the move would bind the pod to the old node without
    # writing the claim: the binding is made here by hand, the same write.
    create_template(cluster, gpu_template("one", 1, ns))
    pod = claim_pod("p", "one", ns, requests={"example.com/dongle": "1"})
    replicaset = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "rs"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "rs"}},
            "template": {"metadata": {"labels": {"app": "rs"}}, "spec": pod["spec"]},
        },
    }
    cluster.cp.admin.post(f"/apis/apps/v1/namespaces/{ns}/replicasets", replicaset)
    try:
        (note,) = wait_until(
            lambda: event_notes(cluster, ns, "DRAReallocated"), timeout=60, what="the claim moved"
        )
        first = A if note.index(A) < note.index(B) else B
        other = B if first == A else A
        (name,) = [
            p["metadata"]["name"] for p in cluster.cp.admin.get(f"/api/v1/namespaces/{ns}/pods")["items"]
        ]
        claim = allocated_claim(cluster, ns, name)
        assert node_of(claim) == other and [r["name"] for r in claim["status"]["reservedFor"]] == [name]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": first},
        }
        cluster.cp.admin.post(f"/api/v1/namespaces/{ns}/pods/{name}/binding", binding)
        (why,) = wait_until(
            lambda: event_notes(cluster, ns, "DRAClaimOnAnotherNode"), timeout=60, what="the Event"
        )
        claim_key = f"{ns}/{claim['metadata']['name']}"
        assert why.startswith(
            f"claim {claim_key} is allocated on node {other} but the pod was bound to node {first}"
        )
        assert "evicted for its controller (ReplicaSet/rs)" in why
        wait_until(
            lambda: cluster.pod(ns, name)["metadata"].get("deletionTimestamp"),
            timeout=30,
            what="the pod evicted",
        )
    finally:
        cleanup(cluster, ns)


def test_a_claim_kube_scheduler_allocated_is_never_handed_out_again(
    cluster: ClusterEnv, nodes: dict[str, DraNode], ns: str
) -> None:
    create_template(cluster, gpu_template("theirs", 4, ns, annotations=OPT_OUT))
    create_template(cluster, gpu_template("ours", 2, ns))
    cluster.create_pod(ns, claim_pod("theirs", "theirs", ns, node=A))
    cluster.wait_bound(ns, "theirs")
    taken = {d for _, d in results(allocated_claim(cluster, ns, "theirs"))}
    for name in ("ours-1", "ours-2"):
        cluster.create_pod(ns, claim_pod(name, "ours", ns, node=A))
        cluster.wait_bound(ns, name)
        mine = {d for _, d in results(allocated_claim(cluster, ns, name))}
        assert not mine & taken, (mine, taken)
        taken |= mine
    assert len(taken) == 8
    # Node A is full: the next pod (pinned there) waits gated, says why, holds nothing.
    cluster.create_pod(ns, claim_pod("ours-3", "ours", ns, node=A))
    wait_until(lambda: event_notes(cluster, ns, "DRAAllocationFailed"), timeout=30, what="the Event")
    assert gates(cluster, ns, "ours-3") == [dra.SCHEDULING_GATE]
    assert not claim_of(cluster, ns, "ours-3").get("status", {}).get("allocation")
    cleanup(cluster, ns)


def test_one_node_is_in_one_mode(cluster: ClusterEnv, nodes: dict[str, DraNode], ns: str) -> None:
    # An extender-path pod (device resources the allocator alone judges) is never placed on a DRA node.
    pod = gpu_pod(
        "extender", resources={"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}
    )
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": A}
    cluster.create_pod(ns, pod)
    message = cluster.wait_pending_reason(ns, "extender", "DRA mode")
    assert "ResourceClaims" in message
    # A claim pod pinned to a device-plugin-mode node is never given its devices there.
    cluster.cp.create_node("plugin-node", labels={dra.MODE_LABEL: dra.MODE_DEVICE_PLUGIN})
    try:
        create_template(cluster, gpu_template("one", 1, ns))
        cluster.create_pod(ns, claim_pod("claims", "one", ns, node="plugin-node"))
        wait_until(lambda: event_notes(cluster, ns, "DRAAllocationFailed"), timeout=30, what="the Event")
        assert not claim_of(cluster, ns, "claims").get("status", {}).get("allocation")
    finally:
        cleanup(cluster, ns)
        cluster.remove_node("plugin-node")


def test_bad_claims_say_why_and_nothing_is_written(
    cluster: ClusterEnv, nodes: dict[str, DraNode], ns: str
) -> None:
    selector = gpu_template("semver", 1, ns)
    selector["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": 'semver("1.0.0").isGreaterThan(semver("0.1.0"))'}}
    ]
    params = gpu_template("params", 1, ns)
    params["spec"]["spec"]["devices"]["config"] = [
        {"opaque": {"driver": dra.DRIVER, "parameters": {"mig": "1g"}}}
    ]
    for tmpl in (selector, params):
        create_template(cluster, tmpl)
        cluster.create_pod(ns, claim_pod(tmpl["metadata"]["name"], tmpl["metadata"]["name"], ns))
    wait_until(
        lambda: (
            event_notes(cluster, ns, "DRAAllocationFailed") and event_notes(cluster, ns, "DRAClaimRefused")
        ),
        timeout=30,
        what="both Events",
    )
    assert "unsupported selector" in event_notes(cluster, ns, "DRAAllocationFailed")[0]
    assert "takes no parameters" in event_notes(cluster, ns, "DRAClaimRefused")[0]
    for name in ("semver", "params"):
        assert gates(cluster, ns, name) == [dra.SCHEDULING_GATE]
        claim = claim_of(cluster, ns, name)
        assert not claim.get("status", {}).get("allocation")
        assert dra.ALLOCATED_BY_ANNOTATION not in (claim["metadata"].get("annotations") or {})
    cleanup(cluster, ns)


@gang_sources(SCHEDULER_PLUGINS, NATIVE, WORKLOAD)
def test_a_gang_of_claims_is_allocated_all_or_nothing(
    cluster: ClusterEnv, nodes: dict[str, DraNode], ns: str, gang_source: GangSource
) -> None:
    """For each way to define a gang (scheduler-plugins' PodGroup, Kubernetes' own PodGroup with
    kube-scheduler's gang plugin, a 1.35 Workload's pod group), sized by its own object."""
    create_template(cluster, gpu_template("eight", 8, ns))
    for group, size in (("pair", 2), ("three", 3)):
        gang_source.create(cluster.cp, ns, group, size)
    pods = {"pair": ["pair-0", "pair-1"], "three": ["three-0", "three-1", "three-2"]}
    for group, names in pods.items():
        for name in names:
            cluster.create_pod(ns, gang_source.join(claim_pod(name, "eight", ns), group))
    # 2 x 8 GPUs: one member per node, both claims allocated, both bound.
    bound = {name: cluster.wait_bound(ns, name)["spec"]["nodeName"] for name in pods["pair"]}
    assert sorted(bound.values()) == [A, B]
    for name in pods["pair"]:
        assert node_of(allocated_claim(cluster, ns, name)) == bound[name]
        assert len(results(allocated_claim(cluster, ns, name))) == 8
    # 3 x 8 GPUs on what is left (nothing): no member's claim is allocated, each says why.
    wait_until(lambda: len(event_notes(cluster, ns, "DRAAllocationFailed")) >= 3, timeout=30, what="Events")
    for name in pods["three"]:
        assert dra.SCHEDULING_GATE in gates(cluster, ns, name)
        assert not claim_of(cluster, ns, name).get("status", {}).get("allocation")
    cleanup(cluster, ns)
