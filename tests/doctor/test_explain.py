"""`topoalloc explain pod`: the story of one pod from what the cluster says of it. On constructed
objects (story.py, pure): a placed pod's allocation decoded device by device from its node's Device
(ids, NUMA, PCIe switch, NVLink domain, how the chosen GPUs reach each other), its pin and Events; a
gang member's gate, why it waits and its gang. The command itself: tests/cli/test_explain_cli.py."""

from __future__ import annotations

from typing import Any

from apis import keys
from apis.annotations import DeviceAllocation, DeviceAllocations
from tests.doctor.healthy import device, iso
from topoalloc.commands.explain.render import render
from topoalloc.commands.explain.story import Context, story

NOW = 1_800_000_000.0


def placed_pod() -> dict[str, Any]:
    allocated = DeviceAllocations({"gpu": [DeviceAllocation(0), DeviceAllocation(1)]}).to_json()
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "gpu-pod",
            "namespace": "default",
            "uid": "uid-gpu-pod",
            "annotations": {keys.DEVICE_ALLOCATED: allocated, keys.ALLOCATED_NODE: "gpu-a"},
        },
        "spec": {
            "nodeName": "gpu-a",
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-a"]}]}
                        ]
                    }
                }
            },
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "c", "state": {"running": {}}}],
        },
    }


def scheduled_event(pod: dict[str, Any], when: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "gpu-pod.1", "namespace": "default"},
        "involvedObject": {
            "kind": "Pod",
            "name": "gpu-pod",
            "namespace": "default",
            "uid": pod["metadata"]["uid"],
        },
        "reason": "Scheduled",
        "message": "Successfully assigned default/gpu-pod to gpu-a",
        "type": "Normal",
        "source": {"component": "default-scheduler"},
        "lastTimestamp": when,
    }


def test_a_placed_pods_allocation_is_decoded_device_by_device() -> None:
    pod = placed_pod()
    ctx = Context(events=[scheduled_event(pod, "2027-01-15T07:59:00Z")], device=device("gpu-a", "dgx-h100"))
    data = story(pod, ctx, NOW)
    alloc = data["allocation"]
    assert alloc["node"] == "gpu-a"
    assert [(d["type"], d["minor"], d["numa"]) for d in alloc["devices"]] == [("gpu", 0, 0), ("gpu", 1, 0)]
    assert alloc["devices"][0]["id"] == "GPU-4cdf9947-cefe-3cb6-c351-2f12d2e0065d"
    assert alloc["devices"][0]["pcieSwitch"] == "0000:16:00.0"
    assert alloc["links"] == ["gpu0-gpu1 NV18"]
    assert data["pin"] == {"affinity": ["gpu-a"], "boundTo": "gpu-a"}
    assert data["waits"] == [] and data["gates"] == [] and data["gang"] is None
    [event] = data["events"]
    assert (event["reason"], event["from"]) == ("Scheduled", "default-scheduler")
    text = render(data, NOW)
    assert (
        text.splitlines()[0] == "pod default/gpu-pod (scheduler default-scheduler): bound to gpu-a, Running"
    )
    assert "allocation: made for gpu-a (scheduling.koordinator.sh/device-allocated)" in text
    assert "  gpu 0; GPU-4cdf9947-cefe-3cb6-c351-2f12d2e0065d; NUMA 0; PCIe switch 0000:16:00.0" in text
    assert "  links: gpu0-gpu1 NV18" in text and "pin: required node affinity to gpu-a" in text


def test_an_allocation_made_for_another_node_or_that_does_not_decode_says_so() -> None:
    pod = placed_pod()
    pod["spec"]["nodeName"] = "gpu-b"
    data = story(pod, Context(), NOW)
    assert data["allocation"]["note"] == "made for gpu-a but bound to gpu-b: the agent on gpu-b chooses anew"
    assert data["allocation"]["deviceNote"] == "no Device of gpu-a read: devices shown by minor only"
    pod["metadata"]["annotations"][keys.DEVICE_ALLOCATED] = '{"gpu": [{"minor": -1}]}'
    assert story(pod, Context(), NOW)["allocation"]["error"].startswith("does not decode")


def gang_member(name: str, node: str = "") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "train",
            "uid": f"uid-{name}",
            "creationTimestamp": iso(900),
            "labels": {"scheduling.x-k8s.io/pod-group": "trainers"},
        },
        "spec": {
            "nodeName": node,
            "schedulingGates": [] if node else [{"name": "topoalloc.io/gang"}],
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}],
        },
        "status": {"phase": "Pending"},
    }


def test_a_gated_gang_member_says_what_it_waits_for_and_its_gang() -> None:
    pod = gang_member("m0")
    waiting = {
        "involvedObject": {"kind": "Pod", "name": "m0", "namespace": "train", "uid": "uid-m0"},
        "reason": "GangWaiting",
        "message": "gang train/trainers: 1 of 2 members exist",
        "type": "Warning",
        "reportingComponent": "topoalloc.io/allocator",
        "lastTimestamp": iso(30),
    }
    group = {"kind": "PodGroup", "spec": {"minMember": 2}, "status": {"phase": "Pending"}}
    ctx = Context(events=[waiting], gang_object=group, members=[pod, gang_member("m1", "gpu-b")])
    data = story(pod, ctx, NOW)
    assert data["gang"] == {
        "name": "train/trainers",
        "source": "podgroup",
        "object": "PodGroup train/trainers",
        "minMember": 2,
        "phase": "Pending",
        "members": ["m0 (not bound)", "m1 (gpu-b)"],
    }
    [wait] = data["waits"]
    assert wait["what"] == "topoalloc.io/gang" and wait["owner"] == "gang"
    assert wait["why"] == "GangWaiting: gang train/trainers: 1 of 2 members exist"
    text = render(data, wait["since"] + 900)
    assert "  topoalloc.io/gang (15m): the gang controller removes it once the whole gang is placed" in text
    assert "    why not yet: GangWaiting: gang train/trainers: 1 of 2 members exist" in text
    assert "gang: train/trainers (podgroup, minimum 2, phase Pending): PodGroup train/trainers" in text
    assert "allocation: none recorded" in text and "gates: topoalloc.io/gang" in text
    # Its PodGroup not there: the gang waits for it.
    assert (
        story(pod, Context(), NOW)["gang"]["object"] == "train/trainers does not exist: the gang waits for it"
    )
