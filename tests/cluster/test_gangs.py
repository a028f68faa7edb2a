"""Scenario 4: gangs on a real control plane. The allocator's admission webhook (called by
kube-apiserver over TLS) gates every member; the gang controller places all members at once or
none; kube-scheduler binds them through the extender. A PodGroup gang, a gang whose members a
Job creates (kube-controller-manager's Job controller), a gang with no room, and its timeout."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.harness import ClusterEnv, gpu_minors, gpu_pod
from tests.support.controlplane import wait_until

POOL = {"topoalloc.test/pool": "gang"}
NODES = ("gang-a", "gang-b")
GATE = "topoalloc.io/gang"
PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"
CONTROLLER = "topoalloc.io/allocator"


@pytest.fixture(scope="module", autouse=True)
def nodes(cluster: ClusterEnv) -> Iterator[None]:
    for node in NODES:
        cluster.add_node(node, "a100-pcie-4x-no-rdma", gpus=4, labels=POOL)
    for node in NODES:
        cluster.wait_device(node)
    yield
    for node in NODES:
        cluster.remove_node(node)


def podgroup(
    cluster: ClusterEnv,
    ns: str,
    name: str,
    min_member: int,
    timeout: int | None = None,
    min_resources: dict[str, str] | None = None,
) -> None:
    spec: dict[str, Any] = {"minMember": min_member}
    if timeout is not None:
        spec["scheduleTimeoutSeconds"] = timeout
    if min_resources:
        spec["minResources"] = min_resources
    cluster.cp.admin.post(
        PODGROUPS.format(ns=ns),
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": spec,
        },
    )


def member(name: str, group: str, gpus: int) -> dict[str, Any]:
    return gpu_pod(
        name,
        resources={"koordinator.sh/gpu": str(100 * gpus)},
        labels={"scheduling.x-k8s.io/pod-group": group},
        node_selector=POOL,
    )


def gates(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or []]


def phase(cluster: ClusterEnv, ns: str, name: str) -> str:
    return str(
        (cluster.cp.admin.get(f"{PODGROUPS.format(ns=ns)}/{name}").get("status") or {}).get("phase", "")
    )


def gang_events(cluster: ClusterEnv, ns: str, reason: str) -> list[dict[str, Any]]:
    return [
        e for e in cluster.events(ns) if e.get("reportingComponent") == CONTROLLER and e["reason"] == reason
    ]


def test_podgroup_gang_binds_all_at_once(cluster: ClusterEnv, ns: str) -> None:
    podgroup(cluster, ns, "trio", 3)
    for name in ("w0", "w1"):
        created = cluster.create_pod(ns, member(name, "trio", 2))
        assert gates(created) == [GATE]  # the webhook gated it at creation
    # Two of three exist: nothing is placed, the members stay gated (and kube-scheduler never sees them).
    wait_until(lambda: phase(cluster, ns, "trio") == "Pending", timeout=30, what="PodGroup trio Pending")
    assert all(not cluster.pod(ns, n)["spec"].get("nodeName") for n in ("w0", "w1"))
    assert all(gates(cluster.pod(ns, n)) == [GATE] for n in ("w0", "w1"))

    cluster.create_pod(ns, member("w2", "trio", 2))
    pods = [cluster.wait_bound(ns, n) for n in ("w0", "w1", "w2")]
    # 6 GPUs on two 4-GPU nodes, no GPU twice per node.
    by_node: dict[str, list[int]] = {}
    for pod in pods:
        by_node.setdefault(pod["spec"]["nodeName"], []).extend(gpu_minors(pod))
    assert sum(len(m) for m in by_node.values()) == 6
    assert all(len(set(m)) == len(m) for m in by_node.values()), by_node
    wait_until(
        lambda: phase(cluster, ns, "trio") in ("Scheduled", "Running"), timeout=30, what="trio Scheduled"
    )
    planned = wait_until(
        lambda: gang_events(cluster, ns, "GangPlanned"), timeout=30, what="GangPlanned Event"
    )
    assert planned[0]["involvedObject"]["kind"] == "PodGroup" and planned[0]["type"] == "Normal"


def test_gang_without_room_stays_gated_then_times_out(cluster: ClusterEnv, ns: str) -> None:
    podgroup(cluster, ns, "huge", 3, timeout=8)
    for i in range(3):  # 3 x 4 GPUs, the pool has 8
        cluster.create_pod(ns, member(f"h{i}", "huge", 4))
    # First "waiting for members" while they are being created, then why the three cannot go.
    [waiting] = wait_until(
        lambda: [
            e
            for e in gang_events(cluster, ns, "GangWaiting")
            if "no placement" in e["message"] and e["involvedObject"]["kind"] == "PodGroup"
        ],
        timeout=60,
        what="a GangWaiting Event saying there is no placement",
    )
    assert "GPU" in waiting["message"], waiting["message"]
    assert all(not cluster.pod(ns, f"h{i}")["spec"].get("nodeName") for i in range(3))
    wait_until(lambda: phase(cluster, ns, "huge") == "Failed", timeout=60, what="PodGroup huge Failed")
    [failed] = wait_until(
        lambda: [
            e for e in gang_events(cluster, ns, "GangFailed") if e["involvedObject"]["kind"] == "PodGroup"
        ],
        timeout=30,
        what="GangFailed Event",
    )
    assert "timeout" in failed["message"], failed["message"]
    # Each member is told too, once (kubectl describe pod shows why it never ran).
    told = wait_until(
        lambda: (
            sorted(
                e["involvedObject"]["name"]
                for e in gang_events(cluster, ns, "GangFailed")
                if e["involvedObject"]["kind"] == "Pod"
            )
            == ["h0", "h1", "h2"]
        ),
        timeout=30,
        what="GangFailed Events on the three members",
    )
    assert told
    # Not even part of it was bound, and the members still carry the gate.
    for i in range(3):
        pod = cluster.pod(ns, f"h{i}")
        assert not pod["spec"].get("nodeName") and gates(pod) == [GATE]


def test_job_created_gang(cluster: ClusterEnv, ns: str) -> None:
    podgroup(cluster, ns, "job-gang", 2)
    template = member("unused", "job-gang", 3)
    template["metadata"].pop("name")
    template["spec"]["restartPolicy"] = "Never"
    cluster.cp.admin.post(
        f"/apis/batch/v1/namespaces/{ns}/jobs",
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "trainer"},
            "spec": {"parallelism": 2, "completions": 2, "backoffLimit": 0, "template": template},
        },
    )

    def job_pods() -> list[dict[str, Any]]:
        return list(
            cluster.cp.admin.get(f"/api/v1/namespaces/{ns}/pods", labelSelector="job-name=trainer")["items"]
        )

    wait_until(lambda: len(job_pods()) == 2, timeout=60, what="the Job's 2 pods")

    def all_bound() -> list[dict[str, Any]] | None:
        pods = job_pods()
        return pods if all(p["spec"].get("nodeName") for p in pods) else None

    bound = wait_until(all_bound, timeout=60, what="both Job pods bound")
    # 3 GPUs each: only one fits per 4-GPU node, so the gang spans both nodes.
    assert sorted(p["spec"]["nodeName"] for p in bound) == list(NODES)
    assert all(len(gpu_minors(p)) == 3 for p in bound)
    # Placed as one gang, by one plan for both members.
    planned = wait_until(
        lambda: gang_events(cluster, ns, "GangPlanned"), timeout=30, what="GangPlanned Event"
    )
    assert planned[0]["involvedObject"]["name"] == "job-gang"
    assert "planned 2 member(s)" in planned[0]["message"], planned[0]["message"]


def test_a_waiting_gang_explains_itself_on_its_pods_and_podgroup(cluster: ClusterEnv, ns: str) -> None:
    # The pool has 8 GPUs; minResources asks for 9: the gang waits, and says so where users look.
    podgroup(cluster, ns, "wide", 1, min_resources={"nvidia.com/gpu": "9"})
    cluster.create_pod(ns, member("m0", "wide", 1))

    def pod_told() -> list[dict[str, Any]]:
        return [
            e
            for e in gang_events(cluster, ns, "GangWaiting")
            if e["involvedObject"]["kind"] == "Pod" and "InsufficientResources" in e["message"]
        ]

    [told] = wait_until(pod_told, timeout=60, what="a GangWaiting Event on the member pod")
    assert told["involvedObject"]["name"] == "m0"
    assert "minResources nvidia.com/gpu=9 is more than" in told["message"], told["message"]

    def described() -> str | None:
        out = cluster.cp.kubectl("describe", "podgroup", "wide", "-n", ns).stdout
        return out if "InsufficientResources" in out else None

    text = wait_until(described, timeout=30, what="kubectl describe podgroup showing the reason")
    assert "minResources nvidia.com/gpu=9 is more than the nodes the gang may use have (8)" in text, text
    pod = cluster.pod(ns, "m0")
    assert not pod["spec"].get("nodeName") and gates(pod) == [GATE]
