"""Scenario: a high-priority gang on a real control plane full of low-priority 1-GPU pods, for each
gang source (tests/cluster/gang_sources.py). The members are gated by the allocator's webhook, so
kube-scheduler never sees them, or (kube-scheduler's gang plugin keeping a native gang whole) reach
kube-scheduler and are held by the extender, which never preempts for a gang member; the gang
controller plans the gang with victims, evicts them through the Eviction API (kube-controller-
manager's disruption controller keeps PodDisruptionBudget status, so budgets are real), holds the
room, and releases the members once the victims are gone (deleted with grace 0 here: no kubelet).
Only the pods of the rack the gang lands in are evicted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.gang_sources import (
    NATIVE,
    NATIVE_WITHOUT_PLUGIN,
    SCHEDULER_PLUGINS,
    GangSource,
    gang_sources,
)
from tests.cluster.harness import ClusterEnv, gpu_pod, racked_dgx_nodes
from tests.support.controlplane import wait_until

NODES = {"gp-a1": "ra", "gp-a2": "ra", "gp-b1": "rb", "gp-b2": "rb"}

pytestmark = gang_sources(SCHEDULER_PLUGINS, NATIVE, NATIVE_WITHOUT_PLUGIN)


@pytest.fixture(scope="module")
def nodes(cluster: ClusterEnv) -> Iterator[dict[str, str]]:
    yield from racked_dgx_nodes(cluster, NODES)


def test_a_high_priority_gang_evicts_one_racks_pods_and_binds_there(
    cluster: ClusterEnv, ns: str, nodes: dict[str, str], gang_source: GangSource
) -> None:
    admin = cluster.cp.admin
    for name, value in ((f"{ns}-low", 10), (f"{ns}-high", 1000)):
        admin.post("/apis/scheduling.k8s.io/v1/priorityclasses", {"metadata": {"name": name}, "value": value})
    fillers = []
    for node in nodes:
        for i in range(8):
            pod = gpu_pod(f"f-{node}-{i}", gpus=1, node_selector={"kubernetes.io/hostname": node})
            pod["spec"]["priorityClassName"] = f"{ns}-low"
            cluster.create_pod(ns, pod)
            fillers.append(pod["metadata"]["name"])
    for name in fillers:
        cluster.wait_bound(ns, name, timeout=120)
    gang_source.create(cluster.cp, ns, "train", 2)
    for i in range(2):
        pod = gang_source.join(gpu_pod(f"train{i}", gpus=8), "train")
        pod["spec"]["priorityClassName"] = f"{ns}-high"
        cluster.create_pod(ns, pod)

    evicted: set[str] = set()

    def members_bound() -> bool:
        cluster.finish_terminating(ns, fillers, evicted)
        return all(cluster.pod(ns, f"train{i}")["spec"].get("nodeName") for i in range(2))

    wait_until(members_bound, timeout=180, what="the gang bound after preemption")
    landed = {cluster.pod(ns, f"train{i}")["spec"]["nodeName"] for i in range(2)}
    assert len(landed) == 2 and len({nodes[n] for n in landed}) == 1  # one rack, a node each
    assert evicted == {f"f-{n}-{i}" for n in landed for i in range(8)}  # exactly those 16
    # kept: the CRD declares them; on a native PodGroup under topoalloc's own condition types
    prefix = "topoalloc.io/" if gang_source.native else ""

    def told_scheduled() -> bool:
        # the gang controller writes the status once it sees the members bound: after the binds
        status = gang_source.get(cluster.cp, ns, "train")["status"]
        kinds = {c["type"]: c for c in status.get("conditions") or []}
        scheduled = kinds.get(prefix + "Scheduled", {}).get("status") == "True"
        return scheduled or status.get("phase") in ("Scheduling", "Scheduled")

    wait_until(told_scheduled, timeout=30, what="the gang's status says it is scheduled")
    status = gang_source.get(cluster.cp, ns, "train")["status"]
    kinds = {c["type"]: c for c in status.get("conditions") or []}
    assert kinds[prefix + "Preempting"]["reason"] in ("EvictingLowerPriorityPods", "NotPreempting")
    reasons = [e.get("reason") for e in cluster.events(ns)]
    assert "GangPreempting" in reasons, reasons
