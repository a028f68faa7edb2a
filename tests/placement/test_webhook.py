"""The placement route: which pods get the gate, and that nothing it reads can make it refuse a pod."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from allocator.placement.webhook import reviewer
from allocator.runtime.placement_settings import PlacementSettings
from apis import keys
from tests.placement.harness import gpu_pod

SETTINGS = PlacementSettings(enabled=True)


def answer(pod: Any, namespace: str = "default", settings: PlacementSettings = SETTINGS, own: str = "topoalloc-system") -> list[Any] | None:  # fmt: skip
    request = {
        "uid": "u",
        "kind": {"kind": "Pod"},
        "operation": "CREATE",
        "namespace": namespace,
        "object": pod,
    }
    got = reviewer(settings, own)(request)
    assert got["allowed"] and got["uid"] == "u"
    return json.loads(base64.b64decode(got["patch"])) if "patch" in got else None


def test_a_pod_asking_for_a_managed_resource_is_gated_whatever_its_scheduler() -> None:
    for scheduler in (None, "default-scheduler", "volcano"):
        pod = gpu_pod("p", schedulerName=scheduler) if scheduler else gpu_pod("p")
        assert answer(pod) == [
            {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": keys.PLACEMENT_GATE}]}
        ]
    gated = gpu_pod("g", schedulingGates=[{"name": keys.GANG_SCHEDULING_GATE}])
    assert answer(gated) == [
        {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": keys.PLACEMENT_GATE}}
    ]
    assert answer(gpu_pod("x", schedulingGates=[{"name": keys.PLACEMENT_GATE}])) is None  # once


@pytest.mark.parametrize(
    ("pod", "namespace", "settings"),
    [
        (gpu_pod("bound", nodeName="n1"), "default", SETTINGS),
        (gpu_pod("out", metadata={"labels": {keys.PLACEMENT: "false"}}), "default", SETTINGS),
        (gpu_pod("sys"), "kube-system", SETTINGS),
        (gpu_pod("own"), "topoalloc-system", SETTINGS),
        (gpu_pod("excluded"), "batch", PlacementSettings(enabled=True, excluded_namespaces=["batch"])),
        (gpu_pod("other"), "default", PlacementSettings(enabled=True, scheduler_names=["volcano"])),
        (gpu_pod("old", schedulerName="topoalloc-scheduler"), "default", SETTINGS),
    ],
    ids=[
        "bound",
        "opted-out",
        "kube-system",
        "own-namespace",
        "excluded",
        "other-scheduler",
        "bound-by-topoalloc",
    ],
)
def test_pods_left_alone(pod: Any, namespace: str, settings: PlacementSettings) -> None:
    assert answer(pod, namespace, settings) is None


def test_a_cpu_pod_and_a_malformed_one_pass_unchanged() -> None:
    cpu = gpu_pod("c")
    cpu["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "2"}}
    assert answer(cpu) is None
    for bad in ({}, {"metadata": "x"}, {"metadata": {}, "spec": {"containers": "no"}},
                {"metadata": {}, "spec": {"containers": [{"resources": {"limits": {keys.PLACEMENT_GATE: 1}}}], "schedulingGates": "x"}}):  # fmt: skip
        assert answer(bad) is None


def test_a_placed_pod_is_left_alone_and_a_failing_decision_gates() -> None:
    """Called again for a pod it placed (a later webhook changed it): nothing more. And should the
    decision at admission fail, the pod is gated, never let through unplaced."""
    placed = gpu_pod("p")
    placed["metadata"]["annotations"] = {
        keys.ALLOCATED_NODE: "n1",
        keys.DEVICE_ALLOCATED: '{"gpu":[{"minor":0}]}',
    }
    placed["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}  # fmt: skip
    assert answer(placed) is None
    unpinned = gpu_pod("q")
    unpinned["metadata"]["annotations"] = dict(placed["metadata"]["annotations"])
    assert answer(unpinned) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": keys.PLACEMENT_GATE}]}
    ]

    def broken(request: Any, pod: Any, namespace: str) -> None:
        raise RuntimeError("a bug")

    request = {
        "uid": "u",
        "kind": {"kind": "Pod"},
        "operation": "CREATE",
        "namespace": "default",
        "object": gpu_pod("r"),
    }
    got = reviewer(SETTINGS, "topoalloc-system", broken)(request)
    assert json.loads(base64.b64decode(got["patch"])) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": keys.PLACEMENT_GATE}]}
    ]
