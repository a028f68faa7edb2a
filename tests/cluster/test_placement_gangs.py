"""Scenario: gangs in placement mode (tests/cluster/placement_mode.py: kube-scheduler without any
topoalloc configuration, the placement webhook gating every GPU pod, the gang webhooks failing
closed, the allocator placing with --placement), for every way to define a gang
(tests/cluster/gang_sources.py; without kube-scheduler's gang plugin kube-scheduler stays without an
extender and the allocator keeps --placement).

* A gang is gated at creation, nothing of it is placed or bound while it is incomplete (checked
  after the gang and placement controllers' next completed passes), and once complete every member
  is bound on the node the allocator recorded for it, no GPU twice.
* Members created while no allocator answers are refused (the gang webhooks fail closed), never
  admitted ungated; created again once the allocator is back, the gang binds whole.
* A high-priority gang that needs room, the cheapest victims protected by a PodDisruptionBudget
  (maxUnavailable 0): the allocator evicts the unprotected lower-priority pods of the other rack
  through the Eviction API and places the gang there when they are gone; kube-scheduler's own
  preemption takes nothing (no pod of its choosing deleted, no node nominated but the placed one).

Four DGX H100 nodes (agents publishing their Devices) on two racks. No kubelet runs: evicted pods
are deleted with grace 0 by the test, as kubelet would finish them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from apis import keys
from tests.cluster.gang_sources import GangSource, gang_events, gang_sources
from tests.cluster.harness import RACK, ClusterEnv, gpu_pod, metrics, racked_dgx_nodes
from tests.cluster.placement_mode import placement_mode, recorded
from tests.support.controlplane import ApiStatus, wait_until

NODES = {"plg-g1": "guarded", "plg-g2": "guarded", "plg-o1": "open", "plg-o2": "open"}

pytestmark = gang_sources()


@pytest.fixture(scope="module")
def nodes(cluster: ClusterEnv) -> Iterator[dict[str, str]]:
    with placement_mode(cluster, ()):
        yield from racked_dgx_nodes(cluster, NODES)


def member(source: GangSource, name: str, group: str, gpus: int) -> dict[str, Any]:
    return source.join(gpu_pod(name, gpus=gpus), group)


def gates(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def gated_at_creation(source: GangSource) -> list[str]:
    """The gang's gate (unless kube-scheduler's gang plugin keeps the gang whole), then placement's."""
    return [keys.GANG_SCHEDULING_GATE, keys.PLACEMENT_GATE] if source.gated else [keys.PLACEMENT_GATE]


def passes(cluster: ClusterEnv, controller: str) -> float:
    return metrics(cluster.leader()).get(
        f'topoalloc_controller_passes_total{{controller="{controller}"}}', 0.0
    )


def after_next_passes(cluster: ClusterEnv, *controllers: str) -> None:
    """Until each controller has completed a pass that started after this call (two more passes:
    the first may have been under way already)."""
    start = {c: passes(cluster, c) for c in controllers}
    wait_until(
        lambda: all(passes(cluster, c) >= start[c] + 2 for c in controllers),
        timeout=60,
        what=f"two more passes of {', '.join(controllers)}",
    )


def assert_nothing_placed(cluster: ClusterEnv, ns: str, names: list[str], source: GangSource) -> None:
    """The gang's controller has seen it incomplete and placement has passed over it since: no member
    bound, none given a node or devices, each still gated as at creation."""
    wait_until(
        lambda: gang_events(cluster.events(ns), source.kind, reason="GangWaiting"),
        timeout=60,
        what="the gang waiting for members",
    )
    after_next_passes(cluster, "gang", "placement")
    for name in names:
        pod = cluster.pod(ns, name)
        assert not pod["spec"].get("nodeName"), f"{name} bound while its gang is incomplete"
        assert keys.ALLOCATED_NODE not in (pod["metadata"].get("annotations") or {}), f"{name} placed early"
        assert gates(pod) == gated_at_creation(source), (name, gates(pod))


def assert_bound_where_placed(cluster: ClusterEnv, ns: str, names: list[str]) -> dict[str, str]:
    """Every member bound on the node the allocator recorded for it, no GPU twice on a node (among
    every bound pod of the namespace); member -> node."""
    pods = {name: cluster.wait_bound(ns, name, timeout=120) for name in names}
    for name, pod in pods.items():
        node, minors = recorded(pod)
        assert pod["spec"]["nodeName"] == node and minors, (name, pod["spec"]["nodeName"], node, minors)
    live = cluster.cp.admin.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    used = [
        (p["spec"]["nodeName"], m)
        for p in live
        if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
        for m in recorded(p)[1]
    ]
    assert len(used) == len(set(used)), sorted(used)
    return {name: pod["spec"]["nodeName"] for name, pod in pods.items()}


def test_a_gang_is_gated_and_binds_whole_where_the_allocator_placed_it(
    cluster: ClusterEnv, ns: str, nodes: dict[str, str], gang_source: GangSource
) -> None:
    source = gang_source
    source.create(cluster.cp, ns, "trio", 3)
    names = ["w0", "w1", "w2"]
    for name in names[:2]:
        created = cluster.create_pod(ns, member(source, name, "trio", 4))
        assert gates(created) == gated_at_creation(source)  # whatever its scheduler

    assert_nothing_placed(cluster, ns, names[:2], source)  # 2 of 3: nothing placed, nothing bound

    cluster.create_pod(ns, member(source, "w2", "trio", 4))
    bound = assert_bound_where_placed(cluster, ns, names)
    assert sum(len(recorded(cluster.pod(ns, n))[1]) for n in names) == 12
    planned = wait_until(
        lambda: gang_events(cluster.events(ns), source.kind, "trio", "GangPlanned"),
        timeout=30,
        what="GangPlanned Event",
    )
    assert "planned 3 member(s)" in planned[0]["message"], planned[0]["message"]
    assert all(node in planned[0]["message"] for node in set(bound.values())), (bound, planned[0]["message"])


def test_a_gang_binds_whole_also_when_the_webhook_was_down_for_some_members(
    cluster: ClusterEnv, ns: str, nodes: dict[str, str], gang_source: GangSource
) -> None:
    source = gang_source
    source.create(cluster.cp, ns, "job", 3)
    assert gates(cluster.create_pod(ns, member(source, "m0", "job", 8))) == gated_at_creation(source)
    # No allocator answers: the gang webhooks fail closed, so no member is created ungated.
    for replica in cluster.replicas.values():
        replica.process.stop()
    try:
        for name in ("m1", "m2"):
            with pytest.raises(ApiStatus) as refused:  # its controller would create it again
                cluster.create_pod(ns, member(source, name, "job", 8))
            assert "webhook" in refused.value.message, refused.value.message
    finally:
        cluster.start_allocator("alloc-a", extra_args=cluster.allocator_args()).wait_ready("/readyz")
    listed = cluster.cp.admin.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    assert [p["metadata"]["name"] for p in listed] == ["m0"]

    cluster.create_pod(ns, member(source, "m1", "job", 8))
    assert_nothing_placed(cluster, ns, ["m0", "m1"], source)  # 2 of 3 after the restart: waits

    cluster.create_pod(ns, member(source, "m2", "job", 8))
    bound = assert_bound_where_placed(cluster, ns, ["m0", "m1", "m2"])
    assert len(set(bound.values())) == 3  # 8 GPUs each: a node each
    for name in bound:
        assert recorded(cluster.pod(ns, name))[1] == list(range(8))


# -- preemption with a budget in the way ----------------------------------------------------------


def _running(cluster: ClusterEnv, ns: str, name: str) -> None:
    """Running and ready, as kubelet would report it (the Eviction API evicts a Pending pod whatever
    its budget says)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": now}
    status = {"phase": "Running", "startTime": now, "conditions": [ready]}
    cluster.cp.admin.merge_patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": status})


def _scene(cluster: ClusterEnv, ns: str) -> tuple[list[str], list[str]]:
    """Every GPU of the four nodes taken by low-priority pods, all placed by the allocator: on rack
    "guarded" a ReplicaSet's two 8-GPU pods (running, ready) under a budget allowing no disruption
    (the cheapest victims: two pods), on rack "open" sixteen unprotected 1-GPU pods. The protected
    pods' names and the fillers'."""
    admin = cluster.cp.admin
    for name, value in ((f"{ns}-low", 10), (f"{ns}-high", 1000)):
        admin.post("/apis/scheduling.k8s.io/v1/priorityclasses", {"metadata": {"name": name}, "value": value})
    template = gpu_pod("keep", gpus=8, labels={"app": "keep"}, node_selector={RACK: "guarded"})
    template["spec"]["priorityClassName"] = f"{ns}-low"
    replicaset = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "keep"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "keep"}},
            "template": {"metadata": {"labels": {"app": "keep"}}, "spec": template["spec"]},
        },
    }
    admin.post(f"/apis/apps/v1/namespaces/{ns}/replicasets", replicaset)
    fillers = []
    for node in (n for n, rack in NODES.items() if rack == "open"):
        for i in range(8):
            pod = gpu_pod(f"f-{node}-{i}", gpus=1, node_selector={"kubernetes.io/hostname": node})
            pod["spec"]["priorityClassName"] = f"{ns}-low"
            cluster.create_pod(ns, pod)
            fillers.append(pod["metadata"]["name"])

    def guarded_bound() -> list[str] | None:
        pods = admin.get(f"/api/v1/namespaces/{ns}/pods", labelSelector="app=keep")["items"]
        names = [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]
        return names if len(names) == 2 else None

    guarded = wait_until(guarded_bound, timeout=120, what="the ReplicaSet's pods bound")
    assert_bound_where_placed(cluster, ns, guarded + fillers)
    for name in guarded:
        _running(cluster, ns, name)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "keep"}}},
    }
    admin.post(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", budget)

    def counted() -> bool:
        status = admin.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/keep").get("status") or {}
        healthy = status.get("currentHealthy") == status.get("desiredHealthy") == 2
        return status.get("observedGeneration", 0) >= 1 and healthy and status.get("disruptionsAllowed") == 0

    wait_until(counted, timeout=60, what="the disruption controller counting the budget")
    return guarded, fillers


@pytest.fixture
def scene(cluster: ClusterEnv, ns: str, nodes: dict[str, str]) -> Iterator[tuple[list[str], list[str]]]:
    yield _scene(cluster, ns)
    path = f"/apis/apps/v1/namespaces/{ns}/replicasets/keep"  # its pods go with the namespace's
    cluster.cp.admin.request("DELETE", path, query={"propagationPolicy": "Orphan"})


def test_a_preempting_gang_goes_around_the_pods_a_budget_protects(
    cluster: ClusterEnv, ns: str, scene: tuple[list[str], list[str]], gang_source: GangSource
) -> None:
    guarded, fillers = scene
    gang_source.create(cluster.cp, ns, "train", 2)
    members = ["train0", "train1"]
    for name in members:
        pod = member(gang_source, name, "train", 8)
        pod["spec"]["priorityClassName"] = f"{ns}-high"
        assert gates(cluster.create_pod(ns, pod)) == gated_at_creation(gang_source)

    evicted: set[str] = set()

    def members_bound() -> bool:
        cluster.finish_terminating(ns, guarded + fillers, evicted)  # kubelet's part
        return all(cluster.pod(ns, name)["spec"].get("nodeName") for name in members)

    wait_until(members_bound, timeout=180, what="the gang bound after preemption")
    bound = assert_bound_where_placed(cluster, ns, members)
    assert len(set(bound.values())) == 2 and {NODES[n] for n in bound.values()} == {"open"}, bound
    assert evicted == set(fillers)  # the sixteen unprotected pods; nothing the budget protects
    for name in guarded:
        assert not cluster.pod(ns, name)["metadata"].get("deletionTimestamp")
    events = cluster.events(ns)
    preempting = gang_events(events, gang_source.kind, "train", "GangPreempting")
    assert preempting and "preempting 16 lower-priority pod(s)" in preempting[0]["message"], preempting
    # kube-scheduler's own preemption never acted: it nominated no node of its choosing for a member
    # and deleted no pod (every pod that went was one the allocator evicted, above).
    for name in members:
        pod = cluster.pod(ns, name)
        assert (pod.get("status") or {}).get("nominatedNodeName") in (None, recorded(pod)[0])
    preempted = [e for e in events if e.get("reason") == "Preempted"]
    assert not preempted, [(e["involvedObject"]["name"], e.get("message")) for e in preempted]
    notes = [e.get("message") or "" for e in events]
    assert not any("refused" in n for n in notes), notes
