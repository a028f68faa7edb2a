"""Pods that wait too long, on constructed objects: a pod gated by placement past the threshold is
named with its condition's reason (warn), and fails when no allocator leads to remove the gate; a
gang member with the gang's Event; a GPU pod kube-scheduler has not bound with its verdict; a claim
topoalloc allocated whose pod, bound for long, never started, with kubelet's word (fail)."""

from __future__ import annotations

from typing import Any

from tests.doctor.healthy import facts, iso, micro
from topoalloc.commands.doctor import waiting
from topoalloc.commands.doctor.findings import FAIL, OK, WARN


def gpu_pod(name: str, age: float, gates: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        "schedulingGates": [{"name": g} for g in gates],
        **extra,
    }
    return {
        "metadata": {"name": name, "namespace": "train", "uid": f"uid-{name}", "creationTimestamp": iso(age)},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def event(
    pod: dict[str, Any], reason: str, message: str, reporter: str = "topoalloc.io/allocator", ago: float = 5
) -> dict:
    return {
        "involvedObject": {
            "kind": "Pod",
            "name": pod["metadata"]["name"],
            "namespace": "train",
            "uid": pod["metadata"]["uid"],
        },
        "reason": reason,
        "message": message,
        "type": "Warning",
        "reportingComponent": reporter,
        "lastTimestamp": iso(ago),
    }


def test_no_pod_waiting_passes() -> None:
    assert [f.status for f in waiting.check(facts(), 300, 300)] == [OK, OK]


def test_a_pod_gated_by_placement_too_long_says_why_from_its_condition() -> None:
    f = facts()
    placed = gpu_pod("big", 900, ("topoalloc.io/placement",))
    placed["status"]["conditions"] = [
        {
            "type": "topoalloc.io/Placed",
            "status": "False",
            "reason": "NoRoom",
            "message": "0/2 nodes can host the pod's devices: 2 too few free GPUs",
        }
    ]
    f.pods += [placed, gpu_pod("young", 60, ("topoalloc.io/placement",))]
    [pods, _] = waiting.check(f, 300, 300)
    assert pods.status == WARN and pods.what.startswith("1 pod(s) gated by topoalloc longer than 5m")
    assert pods.details == (
        "train/big: gate topoalloc.io/placement for 15m: NoRoom: 0/2 nodes can host the pod's devices: 2 too few free GPUs",
    )
    # No leader: nothing removes the gate, a failure.
    f.leases["topoalloc-allocator"]["spec"]["renewTime"] = micro(120)
    [pods, _] = waiting.check(f, 300, 300)
    assert pods.status == FAIL and "no allocator leads, so nothing removes it" in pods.what


def test_a_gang_member_names_the_gangs_event_and_a_component_turned_off_fails() -> None:
    f = facts()
    member = gpu_pod("m0", 1200, ("topoalloc.io/gang",))
    f.pods.append(member)
    f.events = [event(member, "GangWaiting", "gang train/trainers: 1 of 2 members exist")]
    [pods, _] = waiting.check(f, 300, 300)
    assert pods.status == WARN
    assert pods.details == (
        "train/m0: gate topoalloc.io/gang for 20m: GangWaiting: gang train/trainers: 1 of 2 members exist",
    )
    cm = f.configmaps["topoalloc-allocator"]
    assert "gang:\n  enabled: true" in cm["data"]["allocator.yaml"]
    cm["data"]["allocator.yaml"] = cm["data"]["allocator.yaml"].replace(
        "gang:\n  enabled: true", "gang:\n  enabled: false"
    )
    [pods, _] = waiting.check(f, 300, 300)
    assert pods.status == FAIL and "gang.enabled: false" in pods.what


def test_a_gated_pod_with_no_word_from_topoalloc_says_so() -> None:
    f = facts()
    f.pods.append(gpu_pod("quiet", 400, ("topoalloc.io/dra",)))
    [pods, _] = waiting.check(f, 300, 300)
    assert "no Event or condition from topoalloc yet" in pods.details[0]


def test_a_gpu_pod_not_bound_carries_kube_schedulers_verdict() -> None:
    f = facts()
    pending = gpu_pod("stuck", 800)
    pending["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            "lastTransitionTime": iso(700),
        }
    ]
    cpu = gpu_pod("cpu-only", 800)
    cpu["spec"]["containers"][0]["resources"] = {}
    f.pods += [pending, cpu]
    [pods, _] = waiting.check(f, 300, 300)
    assert pods.status == WARN and pods.details == (
        "train/stuck: not bound for 11m: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    )


def _claim(pod_name: str, driver: str = "topoalloc.io") -> dict[str, Any]:
    return {
        "metadata": {"name": f"{pod_name}-gpus", "namespace": "train"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"driver": driver, "pool": "gpu-a", "device": "gpu-0", "request": "g"}]
                }
            },
            "reservedFor": [{"resource": "pods", "name": pod_name, "uid": f"uid-{pod_name}"}],
        },
    }


def test_a_claim_allocated_whose_pod_never_started_fails_with_kubelets_word() -> None:
    f = facts()
    bound = gpu_pod(
        "dra-pod", 1000, resourceClaims=[{"name": "gpus", "resourceClaimTemplateName": "t"}], nodeName="gpu-a"
    )
    bound["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": iso(900)}
    ]
    f.pods.append(bound)
    f.claims = [_claim("dra-pod"), _claim("other", driver="gpu.nvidia.com")]
    f.events = [
        event(bound, "FailedPrepareDynamicResources", "prepare dynamic resources: no plugin", "kubelet")
    ]
    [_, claims] = waiting.check(f, 300, 300)
    assert claims.status == FAIL and claims.details == (
        "claim train/dra-pod-gpus: pod train/dra-pod bound to gpu-a 15m ago, not started: "
        "FailedPrepareDynamicResources: prepare dynamic resources: no plugin",
    )
    bound["status"]["containerStatuses"] = [{"name": "c", "state": {"running": {}}}]
    bound["status"]["phase"] = "Running"
    [_, claims] = waiting.check(f, 300, 300)
    assert claims.status == OK and claims.what.startswith("1 claim(s) allocated by topoalloc")


def test_the_pods_whose_events_are_read_are_those_the_pods_alone_show_waiting() -> None:
    old, young = gpu_pod("old", 900, ("topoalloc.io/gang",)), gpu_pod("young", 10, ("topoalloc.io/gang",))
    assert waiting.stuck([old, young], facts().now, 300) == [old]
