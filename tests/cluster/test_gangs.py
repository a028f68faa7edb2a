"""Scenario 4: gangs on a real control plane, for every way to define one (tests/cluster/gang_sources.py):
scheduler-plugins' PodGroup, Kubernetes' own PodGroup (1.36) with kube-scheduler's gang plugin and
without it, a Workload's pod group (1.35). Where topoalloc gates (scheduler-plugins, or no gang plugin)
its admission webhook gates every member; where kube-scheduler's plugin keeps the gang whole the
members reach kube-scheduler and the extender holds them until the gang is planned. Either way the gang
controller places all members at once or none, and kube-scheduler binds them through the extender. A
gang, a gang whose members a Job creates (kube-controller-manager's Job controller; on 1.36 it makes
the PodGroup too), a gang with no room and its timeout, a waiting gang explaining itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.gang_sources import GangSource, gang_events, gang_sources
from tests.cluster.harness import ClusterEnv, gpu_minors, gpu_pod, ready_nodes
from tests.support.controlplane import wait_until

POOL = {"topoalloc.test/pool": "gang"}
NODES = ("gang-a", "gang-b")
GATE = "topoalloc.io/gang"

pytestmark = gang_sources()


@pytest.fixture(scope="module", autouse=True)
def nodes(cluster: ClusterEnv) -> Iterator[None]:
    with ready_nodes(cluster, dict.fromkeys(NODES, POOL), "a100-pcie-4x-no-rdma", gpus=4):
        yield


def member(source: GangSource, name: str, group: str, gpus: int) -> dict[str, Any]:
    pod = gpu_pod(name, resources={"koordinator.sh/gpu": str(100 * gpus)}, node_selector=POOL)
    return source.join(pod, group)


def gates(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def expected_gates(source: GangSource) -> list[str]:
    """What a member waiting for its plan carries: topoalloc's gate, unless kube-scheduler's gang
    plugin keeps the gang whole."""
    return [GATE] if source.gated else []


def state(cluster: ClusterEnv, source: GangSource, ns: str, name: str) -> str:
    return source.state(cluster.cp, ns, name, cluster.events(ns))


def test_gang_binds_all_at_once(cluster: ClusterEnv, ns: str, gang_source: GangSource) -> None:
    source = gang_source
    source.create(cluster.cp, ns, "trio", 3)
    for name in ("w0", "w1"):
        created = cluster.create_pod(ns, member(source, name, "trio", 2))
        assert gates(created) == expected_gates(source)  # the webhook gated it at creation, or not
    # Two of three exist: nothing is placed (gated, or held by the extender and kube-scheduler's plugin).
    wait_until(
        lambda: gang_events(cluster.events(ns), source.kind, reason="GangWaiting"),
        timeout=30,
        what="the gang waiting for members",
    )
    assert all(not cluster.pod(ns, n)["spec"].get("nodeName") for n in ("w0", "w1"))
    assert all(gates(cluster.pod(ns, n)) == expected_gates(source) for n in ("w0", "w1"))

    cluster.create_pod(ns, member(source, "w2", "trio", 2))
    pods = [cluster.wait_bound(ns, n) for n in ("w0", "w1", "w2")]
    # 6 GPUs on two 4-GPU nodes, no GPU twice per node.
    by_node: dict[str, list[int]] = {}
    for pod in pods:
        by_node.setdefault(pod["spec"]["nodeName"], []).extend(gpu_minors(pod))
    assert sum(len(m) for m in by_node.values()) == 6
    assert all(len(set(m)) == len(m) for m in by_node.values()), by_node
    wait_until(
        lambda: state(cluster, source, ns, "trio") in ("Scheduled", "Running"),
        timeout=30,
        what="trio Scheduled",
    )
    planned = wait_until(
        lambda: gang_events(cluster.events(ns), source.kind, "trio", "GangPlanned"),
        timeout=30,
        what="GangPlanned Event",
    )
    assert planned[0]["type"] == "Normal"


def test_gang_without_room_waits_then_times_out(
    cluster: ClusterEnv, ns: str, gang_source: GangSource
) -> None:
    source = gang_source
    source.create(cluster.cp, ns, "huge", 3, timeout=8)
    for i in range(3):  # 3 x 4 GPUs, the pool has 8
        cluster.create_pod(ns, member(source, f"h{i}", "huge", 4))
    # First "waiting for members" while they are being created, then why the three cannot go.
    [waiting] = wait_until(
        lambda: [
            e
            for e in gang_events(cluster.events(ns), source.kind, reason="GangWaiting")
            if "no placement" in e["message"]
        ],
        timeout=60,
        what="a GangWaiting Event saying there is no placement",
    )
    assert "GPU" in waiting["message"], waiting["message"]
    assert all(not cluster.pod(ns, f"h{i}")["spec"].get("nodeName") for i in range(3))
    wait_until(lambda: state(cluster, source, ns, "huge") == "Failed", timeout=60, what="gang huge Failed")
    [failed] = wait_until(
        lambda: gang_events(cluster.events(ns), source.kind, reason="GangFailed"),
        timeout=30,
        what="GangFailed Event",
    )
    assert "timeout" in failed["message"], failed["message"]
    # Each member is told too, once (kubectl describe pod shows why it never ran).
    told = wait_until(
        lambda: (
            sorted(
                e["involvedObject"]["name"]
                for e in gang_events(cluster.events(ns), "Pod", reason="GangFailed")
            )
            == ["h0", "h1", "h2"]
        ),
        timeout=30,
        what="GangFailed Events on the three members",
    )
    assert told
    # Not even part of it was bound; gated members still carry the gate.
    for i in range(3):
        pod = cluster.pod(ns, f"h{i}")
        assert not pod["spec"].get("nodeName") and gates(pod) == expected_gates(source)


def test_job_created_gang(cluster: ClusterEnv, ns: str, gang_source: GangSource) -> None:
    source = gang_source
    template = member(source, "unused", "job-gang", 3)
    template["metadata"].pop("name")
    template["spec"]["restartPolicy"] = "Never"
    spec: dict[str, Any] = {"parallelism": 2, "completions": 2, "backoffLimit": 0, "template": template}
    if source.kind == "PodGroup" and source.native:
        # 1.36 WorkloadWithJob: an Indexed Job gets its Workload and PodGroup from the Job controller.
        template["spec"].pop("schedulingGroup")
        spec["completionMode"] = "Indexed"
    else:
        source.create(cluster.cp, ns, "job-gang", 2)
    cluster.cp.admin.post(
        f"/apis/batch/v1/namespaces/{ns}/jobs",
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "trainer"}, "spec": spec},
    )

    def job_pods() -> list[dict[str, Any]]:
        return list(
            cluster.cp.admin.get(f"/api/v1/namespaces/{ns}/pods", labelSelector="job-name=trainer")["items"]
        )

    pods = wait_until(lambda: len(p := job_pods()) == 2 and p, timeout=60, what="the Job's 2 pods")
    group = "job-gang"
    if source.kind == "PodGroup" and source.native:
        names = {p["spec"].get("schedulingGroup", {}).get("podGroupName") for p in pods}
        assert len(names) == 1 and None not in names, names  # the Job controller's PodGroup
        group = str(names.pop())

    def all_bound() -> list[dict[str, Any]] | None:
        pods = job_pods()
        return pods if all(p["spec"].get("nodeName") for p in pods) else None

    bound = wait_until(all_bound, timeout=60, what="both Job pods bound")
    # 3 GPUs each: only one fits per 4-GPU node, so the gang spans both nodes.
    assert sorted(p["spec"]["nodeName"] for p in bound) == list(NODES)
    assert all(len(gpu_minors(p)) == 3 for p in bound)
    # Placed as one gang, by one plan for both members.
    planned = wait_until(
        lambda: gang_events(cluster.events(ns), source.kind, reason="GangPlanned"),
        timeout=30,
        what="GangPlanned Event",
    )
    assert planned[0]["involvedObject"]["name"] == group
    assert "planned 2 member(s)" in planned[0]["message"], planned[0]["message"]


def test_a_waiting_gang_explains_itself_on_its_pods_and_object(
    cluster: ClusterEnv, ns: str, gang_source: GangSource
) -> None:
    source = gang_source
    if source.native:
        # Nothing like minResources: a member that fits on no node (4 GPUs each) waits.
        source.create(cluster.cp, ns, "wide", 1)
        cluster.create_pod(ns, member(source, "m0", "wide", 5))
        code, note = "Insufficient", "member " + ns + "/m0 fits on none of"
    else:
        # The pool has 8 GPUs; minResources asks for 9: the gang waits, and says so where users look.
        source.create(cluster.cp, ns, "wide", 1, min_resources={"nvidia.com/gpu": "9"})
        cluster.create_pod(ns, member(source, "m0", "wide", 1))
        code, note = (
            "InsufficientResources",
            "minResources nvidia.com/gpu=9 is more than the nodes the gang may use have (8)",
        )

    def pod_told() -> list[dict[str, Any]]:
        return [
            e for e in gang_events(cluster.events(ns), "Pod", "m0", "GangWaiting") if note in e["message"]
        ]

    # (Once per kind of wait: a cluster changing meanwhile may tell it twice, topology then resources.)
    told = wait_until(pod_told, timeout=60, what="a GangWaiting Event on the member pod")
    assert code in told[0]["message"], told[0]["message"]

    def described() -> str | None:
        out = source.describe(cluster.cp, ns, "wide")
        return out if note in out else None

    # kubectl describe shows it: in the status conditions (topoalloc.io/Waiting on a native
    # PodGroup, beside kube-scheduler's own) or, for a Workload without status, in its Events.
    text = wait_until(described, timeout=30, what="kubectl describe of the gang's object showing the reason")
    if source.kind == "PodGroup":  # the Waiting condition's reason (a Workload has no status)
        assert code in text, text
    pod = cluster.pod(ns, "m0")
    assert not pod["spec"].get("nodeName") and gates(pod) == expected_gates(source)
