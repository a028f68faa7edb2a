"""Publishing against the fake Kubernetes API server, through the official sync client: create, no
write on an unchanged resync, update on change, ownerReference, Node labels and extended resources,
409 and 5xx and a dead server, foreign labels kept, mid-tier resources on the Node."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentConfig
from agent.fixtures.loader import Fixture
from agent.kube import Kube
from agent.main_loop import Agent
from agent.midtier.reclaimable import MidTier, pod_cgroup_dirs
from tests.agent.support import FIXTURES

NODE = "gpu-node-1"
WRITES = ("POST", "PUT", "PATCH", "DELETE")
DEVICE_PATH = f"/apis/scheduling.koordinator.sh/v1alpha1/devices/{NODE}"


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def _node(**alloc: str) -> dict[str, Any]:
    resources = {"cpu": "64", "memory": "256Gi", "pods": "110", **alloc}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


@pytest.fixture
def env(fake_api_thread, fake_api_sync_client):
    node = fake_api_thread.put(_node())
    clock = Clock()
    fx = Fixture.load(FIXTURES / "dgx-h100")
    config = AgentConfig()
    config.mid_tier.enabled = False
    agent = Agent(
        node_name=NODE,
        nvml=fx.nvml,
        sysfs_root=fx.sys_root,
        config=config,
        kube=Kube(fake_api_sync_client),
        clock=clock,
    )
    yield fake_api_thread, agent, fx, clock, node
    agent.shutdown()


def _writes(server, path_fragment: str = "") -> list:
    return [r for r in server.requests() if r.method in WRITES and path_fragment in r.path]


def test_creates_the_device_with_owner_and_status_then_patches_the_node(env) -> None:
    server, agent, _, _, node = env
    result = agent.run_once()
    assert result.errors == []
    dev = server.get("devices", NODE)
    assert dev["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node["metadata"]["uid"]}
    ]
    assert len(dev["spec"]["devices"]) == 20
    assert dev["status"]["summary"] == {"gpus": 8, "rdma": 12, "healthy": "16/20"}
    assert dev["status"]["updateTime"] == "2023-11-14T22:13:20Z"
    assert len(dev["status"]["devices"]) == 20
    n = server.get("nodes", NODE)
    assert n["metadata"]["labels"]["node.koordinator.sh/gpu-model"] == "H100-80GB-HBM3"
    assert n["metadata"]["labels"]["kubernetes.io/hostname"] == NODE  # others' labels kept
    for key in ("capacity", "allocatable"):
        assert n["status"][key]["koordinator.sh/gpu-core"] == "800"
        assert n["status"][key]["koordinator.sh/gpu-memory"] == "652472Mi"
        assert n["status"][key]["koordinator.sh/rdma"] == "800"
        assert n["status"][key]["cpu"] == "64"  # kubelet's resources untouched
    patches = [r for r in server.requests("PATCH")]
    assert {r.content_type.split(";")[0] for r in patches} == {"application/merge-patch+json"}


def test_no_write_on_an_unchanged_resync(env) -> None:
    server, agent, _, clock, _ = env
    agent.run_once()
    server.clear_requests()
    for _ in range(3):
        clock.t += 10
        assert agent.run_once().wrote is False
    assert _writes(server) == []
    clock.t += 120  # past the verify interval: the agent re-reads, still writes nothing
    agent.run_once()
    assert server.requests("GET", DEVICE_PATH) and _writes(server) == []


def test_an_unchanged_device_gets_its_update_time_refreshed_as_a_heartbeat(env) -> None:
    """Nothing changes, yet once status.updateTime is statusRefreshSeconds old it is written anew
    (one status write, nothing else): an old updateTime then means the agent stopped."""
    server, agent, _, clock, _ = env
    agent.run_once()
    first = server.get("devices", NODE)["status"]["updateTime"]
    server.clear_requests()
    clock.t += 299
    agent.run_once()
    assert _writes(server) == []
    clock.t += 1
    agent.run_once()
    assert [r.path for r in _writes(server)] == [DEVICE_PATH + "/status"]
    status = server.get("devices", NODE)["status"]
    assert first == "2023-11-14T22:13:20Z" and status["updateTime"] == "2023-11-14T22:18:20Z"
    server.clear_requests()
    clock.t += 10
    agent.run_once()
    assert _writes(server) == []


def test_a_restarted_agent_refreshes_an_update_time_that_is_already_old(env, fake_api_sync_client) -> None:
    server, agent, fx, clock, _ = env
    agent.run_once()
    agent.shutdown()
    clock.t += 400  # the agent was down longer than the refresh interval
    config = AgentConfig()
    config.mid_tier.enabled = False
    again = Agent(
        node_name=NODE, nvml=fx.nvml, sysfs_root=fx.sys_root, config=config,
        kube=Kube(fake_api_sync_client), clock=clock,
    )  # fmt: skip
    try:
        server.clear_requests()
        again.run_once()
        assert DEVICE_PATH + "/status" in [r.path for r in _writes(server, "devices")]
        assert server.get("devices", NODE)["status"]["updateTime"] == "2023-11-14T22:20:00Z"
    finally:
        again.shutdown()


def test_health_change_is_written_at_once_load_change_is_rate_limited(env) -> None:
    server, agent, fx, clock, _ = env
    agent.run_once()
    server.clear_requests()
    fx.nvml.set_load(0, utilization=57, memory_used=20 << 30)
    clock.t += 10
    agent.run_once()
    assert _writes(server) == []  # load only: waits for status_min_interval
    clock.t += 60
    agent.run_once()
    status = server.get("devices", NODE)["status"]["devices"][0]
    assert status["utilization"] == 60 and status["memoryUsed"] == "20Gi"  # rounded to 10% and 1 GiB
    assert [r.path for r in _writes(server)] == [DEVICE_PATH + "/status"]
    server.clear_requests()
    fx.nvml.lose(1)
    clock.t += 1
    agent.run_once()
    dev = server.get("devices", NODE)
    assert dev["spec"]["devices"][1]["health"] is False
    assert dev["status"]["summary"]["healthy"] == "15/20"
    assert server.get("nodes", NODE)["status"]["allocatable"]["koordinator.sh/gpu-core"] == "700"
    assert {r.path for r in _writes(server)} == {
        DEVICE_PATH,
        DEVICE_PATH + "/status",
        f"/api/v1/nodes/{NODE}/status",
    }


def test_conflict_is_re_read_and_retried(env) -> None:
    server, agent, fx, clock, _ = env
    agent.run_once()
    fx.nvml.lose(2)
    clock.t += 1
    fault = server.inject_fault("PUT", DEVICE_PATH + "$", status=409, times=1)
    result = agent.run_once()
    assert result.errors == [] and fault.hits == 1
    assert server.get("devices", NODE)["spec"]["devices"][2]["health"] is False


@pytest.mark.parametrize("failure", [{"status": 503}, {"status": 500}, {"disconnect": True}])
def test_api_errors_keep_the_agent_running_and_the_good_device(env, failure: dict) -> None:
    server, agent, fx, clock, _ = env
    agent.run_once()
    good = server.get("devices", NODE)
    fault = server.inject_fault(path="/apis/scheduling.koordinator.sh/", times=None, **failure)
    fx.nvml.lose(4)
    clock.t += 1
    result = agent.run_once()
    assert result.errors and "Device" in result.errors[0] and fault.hits >= 1
    assert server.get("devices", NODE)["spec"] == good["spec"]  # nothing half-written
    assert agent.health_state()["ready"] is True and agent.health_state()["errors"]
    server.clear_faults()
    clock.t += 10
    assert agent.run_once().errors == []
    assert server.get("devices", NODE)["spec"]["devices"][4]["health"] is False


def test_node_unreachable_first_means_no_device_yet(fake_api_thread, fake_api_sync_client) -> None:
    fx = Fixture.load(FIXTURES / "dgx-h100")
    agent = Agent(
        node_name="ghost",
        nvml=fx.nvml,
        sysfs_root=fx.sys_root,
        config=AgentConfig(),
        kube=Kube(fake_api_sync_client),
    )
    result = agent.run_once()
    assert any("not readable" in e for e in result.errors)
    assert fake_api_thread.get("devices", "ghost") is None
    assert agent.health_state()["ready"] is False


def test_foreign_labels_are_kept_and_our_removed_keys_go(env) -> None:
    server, agent, _fx, clock, _ = env
    agent.run_once()
    dev = server.get("devices", NODE)
    dev["metadata"]["labels"]["node.koordinator.sh/secondary-device-well-planned"] = "true"
    dev["metadata"]["labels"]["node.koordinator.sh/gpu-partition-policy"] = "Stale"
    server.put(dev)
    clock.t += 120
    agent.run_once()
    labels = server.get("devices", NODE)["metadata"]["labels"]
    assert labels["node.koordinator.sh/secondary-device-well-planned"] == "true"
    assert labels["node.koordinator.sh/gpu-partition-policy"] == "Honor"


def test_no_healthy_gpu_removes_the_gpu_resources_from_the_node(env) -> None:
    server, agent, fx, clock, _ = env
    agent.run_once()
    for i in range(8):
        fx.nvml.lose(i)
    clock.t += 1
    agent.run_once()
    alloc = server.get("nodes", NODE)["status"]["allocatable"]
    assert "koordinator.sh/gpu-core" not in alloc and "koordinator.sh/gpu" not in alloc
    assert alloc["koordinator.sh/rdma"] == "800" and alloc["cpu"] == "64"


def test_restart_with_broken_nvml_does_not_empty_the_device(env, fake_api_sync_client) -> None:
    server, agent, _fx, clock, _ = env
    agent.run_once()
    broken = Fixture.load(FIXTURES / "dgx-h100")
    broken.nvml.fail_init("DRIVER_NOT_LOADED")
    restarted = Agent(
        node_name=NODE,
        nvml=broken.nvml,
        sysfs_root=broken.sys_root,
        config=AgentConfig(),
        kube=Kube(fake_api_sync_client),
        clock=clock,
    )
    restarted.config.mid_tier.enabled = False
    assert restarted.run_once().errors == []
    dev = server.get("devices", NODE)
    gpus = [d for d in dev["spec"]["devices"] if d["type"] == "gpu"]
    assert len(gpus) == 8 and all(not g["health"] for g in gpus)
    assert {g["conditions"][0]["reason"] for g in gpus} == {"NVMLUnavailable"}
    broken.nvml.fail_init(None)  # the driver comes back: the same GPUs, healthy again
    clock.t += 10
    restarted.run_once()
    assert server.get("devices", NODE)["status"]["summary"]["healthy"] == "16/20"
    restarted.shutdown()


def _pod(name: str, cpu: str, mem: str, *, priority: int = 9500, node: str = NODE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "priority": priority,
            "containers": [
                {"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu, "memory": mem}}}
            ],
        },
        "status": {"phase": "Running", "qosClass": "Burstable"},
    }


def test_mid_tier_values_on_the_node_follow_the_formula(
    fake_api_thread, fake_api_sync_client, tmp_path: Path
) -> None:
    server = fake_api_thread
    server.put(_node())
    trainer = server.put(_pod("trainer", "16", "64Gi"))
    server.put(_pod("elsewhere", "8", "8Gi", node="another-node"))  # not on this node
    server.put(_pod("batch", "8", "8Gi", priority=5000))  # not prod
    root = tmp_path / "cgroup"
    cg = pod_cgroup_dirs(root, trainer["metadata"]["uid"], "Burstable")[0]
    cg.mkdir(parents=True)
    clock = Clock()
    fx = Fixture.load(FIXTURES / "cpu-only")
    config = AgentConfig()
    config.mid_tier.cgroup_root = str(root)
    config.mid_tier.safe_margin = 0.1
    agent = Agent(
        node_name=NODE,
        nvml=fx.nvml,
        sysfs_root=fx.sys_root,
        config=config,
        kube=Kube(fake_api_sync_client),
        clock=clock,
    )
    agent.cluster.mid = MidTier(config.mid_tier, node_usage=lambda: (20_000, 100 << 30), clock=clock)
    try:
        agent.run_once()  # starts the pod watch
        assert agent.pods.started and agent.pods.synced.wait(5)
        assert [p.name for p in agent.pods.pods()] and all(
            p.name != "default/elsewhere" for p in agent.pods.pods()
        )
        for usec, mem in [(0, 40 << 30), (40_000_000, 50 << 30), (80_000_000, 30 << 30)]:  # 4 cores busy
            (cg / "cpu.stat").write_text(f"usage_usec {usec}\n")
            (cg / "memory.current").write_text(f"{mem}\n")
            clock.t += 10
            agent.run_once()
        clock.t += 10
        agent.run_once()
        node = server.get("nodes", NODE)["status"]
        # cpu: 16 cores requested - 4 cores peak x 1.1 = 11.6 cores (the node has 44 unused)
        assert node["allocatable"]["kubernetes.io/mid-cpu"] == "11600"
        assert node["capacity"]["kubernetes.io/mid-cpu"] == "11600"
        # memory: 64 Gi requested - 50 Gi peak x 1.1, well under the 156 Gi unused
        assert node["allocatable"]["kubernetes.io/mid-memory"] == str((64 << 30) - (50 << 30) * 11 // 10)
        # the metrics go away: nothing is published rather than a guess
        shutil.rmtree(root)
        clock.t += 10
        agent.run_once()
        alloc = server.get("nodes", NODE)["status"]["allocatable"]
        assert "kubernetes.io/mid-cpu" not in alloc and "kubernetes.io/mid-memory" not in alloc
    finally:
        agent.shutdown()
