"""Scenario: Reservations on the real control plane. The allocator (leader) places each
Reservation with the same core as a pod, writes its devices and status (shown by `kubectl get
reservations`), and kube-scheduler then binds owners through the extender onto exactly the reserved
devices; non-owners find them taken, reservation-ignored pods do not; exact-match, affinity by
name and by taints choose among rooms; allocateOnce and expiry give room back; a Reservation with a
priority evicts only lower-priority pods; a SIGKILLed allocator finds every room again; a bad
Reservation gets a condition saying why."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from apis import keys
from apis.reservation_pod import EXACT_MATCH, RESERVATION_AFFINITY, RESERVATION_ALLOCATED, RESERVATION_IGNORED
from tests.cluster.harness import DEVICES, ClusterEnv, allocated, gpu_minors, gpu_pod, ready_nodes
from tests.support.controlplane import ApiStatus, wait_until

POOL = {"topoalloc.test/pool": "resv"}
NODES = ("rv-a", "rv-b")
RESERVATIONS = "/apis/scheduling.koordinator.sh/v1alpha1/reservations"
JOINT = json.dumps({"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"})
RDMA = "koordinator.sh/rdma"


@pytest.fixture(scope="module", autouse=True)
def nodes(cluster: ClusterEnv) -> Iterator[None]:
    with ready_nodes(cluster, dict.fromkeys(NODES, POOL)):
        yield


@pytest.fixture
def made(cluster: ClusterEnv) -> Iterator[list[str]]:
    """Names of the Reservations a test creates (cluster-scoped: deleted after it)."""
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(ApiStatus):
            cluster.cp.admin.delete(f"{RESERVATIONS}/{name}")


def reservation(
    name: str, *, gpus: int, owner: str, node: str | None = None, joint: bool = False, **spec: Any
) -> dict[str, Any]:
    """A Reservation of `gpus` GPUs (and with `joint`, their NICs on the same PCIe switches) for the
    pods labelled app=`owner`, on the pool (or on `node`)."""
    requests = {"nvidia.com/gpu": str(gpus)}
    annotations = {}
    if joint:
        requests[RDMA] = "1"
        annotations[keys.DEVICE_JOINT_ALLOCATE] = JOINT
    template_spec: dict[str, Any] = {
        "nodeSelector": dict(POOL),
        "containers": [{"name": "main", "resources": {"requests": requests, "limits": dict(requests)}}],
    }
    if node:
        template_spec["nodeName"] = node
    for key in ("priorityClassName", "priority"):
        if key in spec:
            template_spec[key] = spec.pop(key)
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "metadata": {"namespace": "default", "annotations": annotations},
                "spec": template_spec,
            },
            "owners": [{"labelSelector": {"matchLabels": {"app": owner}}}],
            **spec,
        },
    }


def create(cluster: ClusterEnv, made: list[str], body: dict[str, Any]) -> None:
    cluster.cp.admin.post(RESERVATIONS, body)
    made.append(body["metadata"]["name"])


def get(cluster: ClusterEnv, name: str) -> dict[str, Any]:
    return cluster.cp.admin.get(f"{RESERVATIONS}/{name}")


def wait_phase(cluster: ClusterEnv, name: str, phase: str, timeout: float = 60.0) -> dict[str, Any]:
    return wait_until(
        lambda: (r := get(cluster, name)).get("status", {}).get("phase") == phase and r,
        timeout=timeout,
        what=f"Reservation {name} {phase}",
    )


def reserved(res: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(res["metadata"]["annotations"][keys.DEVICE_ALLOCATED]))


def owner_pod(name: str, app: str, gpus: int, **kwargs: Any) -> dict[str, Any]:
    labels = {"app": app, **kwargs.pop("labels", {})}
    return gpu_pod(name, gpus=gpus, labels=labels, node_selector=kwargs.pop("node_selector", POOL), **kwargs)


def on(node: str) -> dict[str, str]:
    return {"kubernetes.io/hostname": node}


def test_a_reservation_of_gpu_nic_pairs_is_shown_and_its_owner_lands_on_its_devices(
    cluster: ClusterEnv, ns: str, made: list[str]
) -> None:
    create(cluster, made, reservation(f"pairs-{ns}", gpus=2, owner=ns, joint=True))
    res = wait_phase(cluster, f"pairs-{ns}", "Available")
    node = res["status"]["nodeName"]
    devices = reserved(res)
    device = cluster.cp.admin.get(f"{DEVICES}/{node}")
    switch = {(d["type"], d["minor"]): d["topology"].get("pcieSwitchID") for d in device["spec"]["devices"]}
    gpu_switches = sorted(switch["gpu", g["minor"]] for g in devices["gpu"])
    assert len(devices["gpu"]) == 2 and gpu_switches == sorted(
        switch["rdma", r["minor"]] for r in devices["rdma"]
    )
    assert res["status"]["allocatable"]["nvidia.com/gpu"] == "2"

    table = cluster.cp.kubectl("get", "reservations", f"pairs-{ns}").stdout.split("\n")
    assert table[0].split() == ["NAME", "PHASE", "AGE", "NODE", "TTL", "EXPIRES"], table
    assert table[1].split()[:2] == [f"pairs-{ns}", "Available"] and node in table[1] and "24h" in table[1]

    pod = owner_pod("owner", ns, 2, resources={RDMA: "1"}, annotations={keys.DEVICE_JOINT_ALLOCATE: JOINT})
    cluster.create_pod(ns, pod)
    bound = cluster.wait_bound(ns, "owner")
    assert bound["spec"]["nodeName"] == node
    got = allocated(bound)
    assert sorted(g["minor"] for g in got["gpu"]) == sorted(g["minor"] for g in devices["gpu"])
    assert sorted(r["minor"] for r in got["rdma"]) == sorted(r["minor"] for r in devices["rdma"])
    mark = json.loads(bound["metadata"]["annotations"][RESERVATION_ALLOCATED])
    assert mark == {"name": f"pairs-{ns}", "uid": res["metadata"]["uid"]}
    done = wait_phase(cluster, f"pairs-{ns}", "Succeeded")  # allocateOnce (the default)
    assert [o["name"] for o in done["status"]["currentOwners"]] == ["owner"]


def test_a_non_owner_cannot_take_reserved_gpus_and_an_ignored_pod_can(
    cluster: ClusterEnv, ns: str, made: list[str]
) -> None:
    create(cluster, made, reservation(f"whole-{ns}", gpus=8, owner=f"nobody-{ns}", node="rv-a"))
    wait_phase(cluster, f"whole-{ns}", "Available")
    cluster.create_pod(ns, gpu_pod("outsider", gpus=1, node_selector=on("rv-a")))
    cluster.wait_pending_reason(ns, "outsider", "GPU")
    ignored = gpu_pod("ignored", gpus=1, node_selector=on("rv-a"), labels={RESERVATION_IGNORED: "true"})
    cluster.create_pod(ns, ignored)
    assert cluster.wait_bound(ns, "ignored")["spec"]["nodeName"] == "rv-a"
    assert get(cluster, f"whole-{ns}")["status"]["phase"] == "Available"  # ignored pods own nothing


def test_exact_match_and_affinity_by_name(cluster: ClusterEnv, ns: str, made: list[str]) -> None:
    create(cluster, made, reservation(f"two-{ns}", gpus=2, owner=ns, node="rv-b"))
    create(cluster, made, reservation(f"four-{ns}", gpus=4, owner=ns, node="rv-b"))
    two = reserved(wait_phase(cluster, f"two-{ns}", "Available"))
    four = reserved(wait_phase(cluster, f"four-{ns}", "Available"))
    # exact-match on nvidia.com/gpu: a 2-GPU owner only takes the 2-GPU room.
    exact = {EXACT_MATCH: json.dumps({"resourceNames": ["nvidia.com/gpu"]})}
    cluster.create_pod(ns, owner_pod("exact", ns, 2, annotations=exact))
    pod = cluster.wait_bound(ns, "exact")
    assert gpu_minors(pod) == sorted(g["minor"] for g in two["gpu"])
    assert json.loads(pod["metadata"]["annotations"][RESERVATION_ALLOCATED])["name"] == f"two-{ns}"
    # reservation-affinity by name: a 1-GPU owner goes to the room it names.
    named = {RESERVATION_AFFINITY: json.dumps({"name": f"four-{ns}"})}
    cluster.create_pod(ns, owner_pod("named", ns, 1, annotations=named))
    pod = cluster.wait_bound(ns, "named")
    assert set(gpu_minors(pod)) <= {g["minor"] for g in four["gpu"]}
    assert json.loads(pod["metadata"]["annotations"][RESERVATION_ALLOCATED])["name"] == f"four-{ns}"


def test_taints_keep_owners_out_unless_tolerated(cluster: ClusterEnv, ns: str, made: list[str]) -> None:
    taint = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    create(cluster, made, reservation(f"tainted-{ns}", gpus=2, owner=ns, node="rv-b", taints=[taint]))
    room = reserved(wait_phase(cluster, f"tainted-{ns}", "Available"))
    # A pod that must land in a reservation but does not tolerate the taint waits, saying why.
    required = {RESERVATION_AFFINITY: json.dumps({"reservationSelector": {}})}
    cluster.create_pod(ns, owner_pod("intolerant", ns, 2, annotations=required))
    cluster.wait_pending_reason(ns, "intolerant", "Reservation")
    tolerant = {
        RESERVATION_AFFINITY: json.dumps(
            {
                "tolerations": [
                    {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
                ]
            }
        )
    }
    cluster.create_pod(ns, owner_pod("tolerant", ns, 2, annotations=tolerant))
    pod = cluster.wait_bound(ns, "tolerant")
    assert gpu_minors(pod) == sorted(g["minor"] for g in room["gpu"])


def test_allocate_once_and_expiry_give_room_back(cluster: ClusterEnv, ns: str, made: list[str]) -> None:
    create(cluster, made, reservation(f"once-{ns}", gpus=8, owner=ns, node="rv-a"))
    wait_phase(cluster, f"once-{ns}", "Available")
    cluster.create_pod(ns, owner_pod("first", ns, 4, node_selector=on("rv-a")))
    first = cluster.wait_bound(ns, "first")
    wait_phase(cluster, f"once-{ns}", "Succeeded")
    # The other four GPUs went back to the node with allocateOnce: a non-owner takes them.
    cluster.create_pod(ns, gpu_pod("after", gpus=4, node_selector=on("rv-a")))
    after = cluster.wait_bound(ns, "after")
    assert set(gpu_minors(after)).isdisjoint(gpu_minors(first))

    create(cluster, made, reservation(f"brief-{ns}", gpus=8, owner=ns, node="rv-b", ttl="4s"))
    wait_phase(cluster, f"brief-{ns}", "Available")
    failed = wait_phase(cluster, f"brief-{ns}", "Failed", timeout=60)
    ready = {c["type"]: c for c in failed["status"]["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "Expired")
    cluster.create_pod(ns, gpu_pod("freed", gpus=8, node_selector=on("rv-b")))
    assert cluster.wait_bound(ns, "freed")["spec"]["nodeName"] == "rv-b"


def test_a_reservation_with_priority_evicts_lower_priority_pods_only(
    cluster: ClusterEnv, ns: str, made: list[str]
) -> None:
    admin = cluster.cp.admin
    for name, value in ((f"{ns}-low", 10), (f"{ns}-mid", 500), (f"{ns}-high", 1000)):
        admin.post("/apis/scheduling.k8s.io/v1/priorityclasses", {"metadata": {"name": name}, "value": value})
    fillers = {}
    for i in range(8):
        level = "high" if i < 4 else "low"
        pod = gpu_pod(f"{level}-{i}", gpus=1, node_selector=on("rv-b"))
        pod["spec"]["priorityClassName"] = f"{ns}-{level}"
        cluster.create_pod(ns, pod)
        fillers[f"{level}-{i}"] = level
        cluster.wait_bound(ns, f"{level}-{i}")
    body = reservation(f"urgent-{ns}", gpus=4, owner=ns, node="rv-b", priorityClassName=f"{ns}-mid")
    create(cluster, made, body)
    evicted: set[str] = set()

    def available() -> bool:
        cluster.finish_terminating(ns, fillers, evicted)
        return get(cluster, f"urgent-{ns}").get("status", {}).get("phase") == "Available"

    wait_until(available, timeout=120, what="the reservation placed after preemption")
    assert evicted and all(fillers[name] == "low" for name in evicted), evicted
    for name, level in fillers.items():
        if level == "high":
            assert cluster.pod(ns, name)["spec"]["nodeName"] == "rv-b"
    reasons = [
        e.get("reason")
        for e in cluster.events("default")
        if e.get("involvedObject", {}).get("kind") == "Reservation"
    ]
    assert "Preempting" in reasons, reasons


def test_a_sigkilled_allocator_keeps_an_available_reservation(
    cluster: ClusterEnv, ns: str, made: list[str]
) -> None:
    create(cluster, made, reservation(f"kept-{ns}", gpus=8, owner=ns, node="rv-a"))
    before = wait_phase(cluster, f"kept-{ns}", "Available")
    leader = cluster.leader()
    leader.process.kill()
    cluster.start_allocator(leader.identity).wait_ready()
    wait_until(lambda: cluster.leader().health("/readyz")[0] == 200, timeout=60, what="a ready leader")
    after = get(cluster, f"kept-{ns}")
    assert after["status"]["phase"] == "Available" and reserved(after) == reserved(before)
    cluster.create_pod(ns, gpu_pod("outsider", gpus=1, node_selector=on("rv-a")))
    cluster.wait_pending_reason(ns, "outsider", "GPU")
    cluster.create_pod(ns, owner_pod("owner", ns, 8, node_selector=on("rv-a")))
    assert sorted(gpu_minors(cluster.wait_bound(ns, "owner"))) == list(range(8))


def test_bad_reservations_get_a_condition_and_nothing_breaks(
    cluster: ClusterEnv, ns: str, made: list[str]
) -> None:
    bad_ttl = reservation(f"bad-ttl-{ns}", gpus=1, owner=ns, ttl="soon")
    bad_selector = reservation(f"bad-owner-{ns}", gpus=1, owner=ns)
    bad_selector["spec"]["owners"] = [
        {"labelSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}
    ]
    bad_template = reservation(f"bad-template-{ns}", gpus=1, owner=ns)
    bad_template["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = (
        "1.5"
    )
    for body in (bad_ttl, bad_selector, bad_template):
        create(cluster, made, body)

    def condition(name: str) -> dict[str, Any] | None:
        status = get(cluster, name).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c.get("type") == "Scheduled"), None)

    for name, reason, words in (
        (f"bad-ttl-{ns}", "Invalid", "spec.ttl"),
        (f"bad-owner-{ns}", "Invalid", "operator"),
        (f"bad-template-{ns}", "Unschedulable", "template is invalid"),
    ):
        got = wait_until(lambda n=name: condition(n), timeout=60, what=f"a condition on {name}")
        assert (got["status"], got["reason"]) == ("False", reason) and words in got["message"], got
    assert cluster.leader().health("/healthz")[0] == 200
    create(cluster, made, reservation(f"good-{ns}", gpus=1, owner=ns))
    wait_phase(cluster, f"good-{ns}", "Available")
