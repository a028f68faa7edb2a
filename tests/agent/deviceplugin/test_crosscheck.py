"""After admission the agent compares kubelet's PodResources with the annotations: a container
holding other devices than annotated is an Event, a metric, and for GPUs a corrected annotation."""

from __future__ import annotations

import contextlib
import logging

import pytest
from prometheus_client import REGISTRY

from apis import keys
from apis.annotations import parse_device_allocated
from tests.agent.deviceplugin.rig import allocated, gpu_entry, rdma_entry
from tests.agent.deviceplugin.test_kubelet_flow import H100, _wait


def _metric(resource: str) -> float:
    return REGISTRY.get_sample_value("topoalloc_agent_device_mismatches_total", {"resource": resource}) or 0.0


def test_podresources_cross_check(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    good = rig.put_pod(
        "good",
        {"main": {"nvidia.com/gpu": "1", "koordinator.sh/rdma": "1"}},
        allocated([gpu_entry(2, H100[2])], [rdma_entry(4, "0000:4f:00.0", "0000:4f:00.2")]),
    )
    moved = rig.put_pod("moved", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(4, H100[4])]))
    kubelet.admit(good)
    kubelet.admit(moved)
    checker = rig.plugins.checker
    assert checker.check() == []
    assert rig.events("DeviceAllocationMismatch") == []

    # kubelet's truth changes under us (e.g. a second plugin for nvidia.com/gpu served the pod)
    kubelet.allocations["default/moved"]["main"]["nvidia.com/gpu"] = [H100[5]]
    # and a pod the allocator never saw was admitted with GPU 7
    rig.put_pod("stranger", {"main": {"nvidia.com/gpu": "1"}}, None)
    kubelet.allocations["default/stranger"] = {"main": {"nvidia.com/gpu": [H100[7]]}}
    before = _metric("nvidia.com/gpu")

    found = checker.check()
    assert sorted((m.pod, m.resource, m.container, m.kubelet) for m in found) == [
        ("default/moved", "nvidia.com/gpu", "main", (H100[5],)),
        ("default/stranger", "nvidia.com/gpu", "main", (H100[7],)),
    ]
    assert _metric("nvidia.com/gpu") == before + 2
    events = {e["involvedObject"]["name"]: e for e in rig.events("DeviceAllocationMismatch")}
    assert sorted(events) == ["moved", "stranger"]
    assert H100[5] in events["moved"]["message"] and events["moved"]["type"] == "Warning"

    fixed = parse_device_allocated(
        rig.server.get("pods", "moved", "default")["metadata"]["annotations"][keys.DEVICE_ALLOCATED]
    )
    assert [(e.minor, e.id) for e in fixed["gpu"]] == [(5, H100[5])]
    assert {k: str(v) for k, v in fixed["gpu"][0].resources.items()} == {
        "koordinator.sh/gpu-core": "100",
        "koordinator.sh/gpu-memory": "81559Mi",
        "koordinator.sh/gpu-memory-ratio": "100",
    }
    made = parse_device_allocated(
        rig.server.get("pods", "stranger", "default")["metadata"]["annotations"][keys.DEVICE_ALLOCATED]
    )
    assert [(e.minor, e.id) for e in made["gpu"]] == [(7, H100[7])]
    assert str(made["gpu"][0].resources["koordinator.sh/gpu-memory"]) == "81559Mi"

    # corrected: the next pass finds nothing more to say
    assert checker.check() == []


def test_cross_check_without_kubelet_reports_the_error(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent(wait_for=("nvidia.com/gpu",))
    kubelet.stop()
    assert rig.plugins.checker.check() == []
    assert rig.plugins.checker.error.startswith(f"PodResources {rig.pr_socket}: UNAVAILABLE")


def test_cross_check_with_the_api_server_unreachable_skips_the_pass_without_a_traceback(
    make_rig, caplog: pytest.LogCaptureFixture
) -> None:
    """kube-apiserver restarting is expected: the pass is skipped with a warning naming it (the
    soak found it logged as an unexpected exception, with a traceback, by the loop)."""
    rig = make_rig("dgx-h100")
    rig.start_kubelet()
    rig.start_agent(wait_for=("nvidia.com/gpu",))
    rig.server.inject_fault("GET", r"/api/v1/pods$", watch=False, disconnect=True, times=None)
    with caplog.at_level(logging.WARNING, logger="agent.deviceplugin.crosscheck"):
        assert rig.plugins.checker.check() == []
    rig.server.clear_faults()
    assert rig.plugins.checker.error.startswith(f"cannot list the pods of node {rig.plugins.node_name}")
    mine = [r for r in caplog.records if r.name == "agent.deviceplugin.crosscheck"]
    assert [(r.levelno, r.exc_info) for r in mine] == [(logging.WARNING, None)]
    assert rig.plugins.checker.check() == [] and rig.plugins.checker.error == ""


def test_refusals_and_mismatches_on_the_health_endpoint(make_rig) -> None:
    import json
    import urllib.request

    from agent.healthz import HealthServer
    from tests.support.kubelet import AdmissionError

    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    assert rig.agent is not None
    assert _wait(lambda: len(rig.plugins.registrar.registered()) == 4)  # Register() has returned
    health = HealthServer("127.0.0.1", 0, rig.agent.health_state)
    health.start()
    try:
        bad = rig.put_pod("no-such-gpu", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(9)]))
        with contextlib.suppress(AdmissionError):
            kubelet.admit(bad)
        with urllib.request.urlopen(f"http://127.0.0.1:{health.port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert 'topoalloc_agent_allocate_refusals_total{resource="nvidia.com/gpu"}' in text
        assert "topoalloc_agent_device_mismatches_total" in text
        with urllib.request.urlopen(f"http://127.0.0.1:{health.port}/status", timeout=5) as resp:
            status = json.loads(resp.read())
        assert status["devicePlugin"] == {
            "registered": [
                "koordinator.sh/gpu",
                "koordinator.sh/gpu-core",
                "koordinator.sh/rdma",
                "nvidia.com/gpu",
            ],
            "error": "",
            "served": 0,
            "refusals": 1,
            "mismatches": 0,
            "namedWithoutPodResources": 0,
            "chosenOnNodeWritesPending": 0,
        }
    finally:
        health.stop()


def test_a_pod_kubelet_is_still_admitting_is_not_a_mismatch(make_rig) -> None:
    """kubelet allocates a pod's containers one after another: between them the first holds its
    GPUs and the second none yet. The cross-check judges the first and waits for the second; it
    neither reports nor rewrites the annotation to the first container's GPUs alone."""
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent(wait_for=("nvidia.com/gpu",))
    annotation = allocated([gpu_entry(2, H100[2]), gpu_entry(3, H100[3]), gpu_entry(7, H100[7])])
    rig.put_pod("split", {"trainer": {"nvidia.com/gpu": "2"}, "helper": {"nvidia.com/gpu": "1"}}, annotation)
    kubelet.active["default/split"] = ["trainer", "helper"]
    kubelet.allocations["default/split"] = {"trainer": {"nvidia.com/gpu": [H100[2], H100[3]]}}
    assert rig.plugins.checker.check() == []
    assert rig.events("DeviceAllocationMismatch") == []
    pod = rig.server.get("pods", "split", "default")
    assert pod["metadata"]["annotations"][keys.DEVICE_ALLOCATED] == annotation
    # the first container on other GPUs is still a mismatch while the second waits
    kubelet.allocations["default/split"]["trainer"]["nvidia.com/gpu"] = [H100[4], H100[5]]
    found = rig.plugins.checker.check()
    assert [(m.container, m.kubelet) for m in found] == [("trainer", (H100[4], H100[5]))]
    pod = rig.server.get("pods", "split", "default")
    assert pod["metadata"]["annotations"][keys.DEVICE_ALLOCATED] == annotation  # not from half the truth
    # once the second container holds its GPU too, the annotation is rewritten to the whole truth
    kubelet.allocations["default/split"]["helper"] = {"nvidia.com/gpu": [H100[7]]}
    assert [m.container for m in rig.plugins.checker.check()] == ["trainer"]
    fixed = parse_device_allocated(
        rig.server.get("pods", "split", "default")["metadata"]["annotations"][keys.DEVICE_ALLOCATED]
    )
    assert [e.minor for e in fixed["gpu"]] == [4, 5, 7]
