"""Health and faults without a cluster: Xid events, NVML errors on one GPU, a lost GPU, no NVML,
odd sysfs. The agent keeps running, publishes what it knows and says why the rest is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.discovery.device_health import EventWatcher, HealthBook
from agent.discovery.discoverer import Discoverer
from agent.discovery.sysfs import Sysfs
from agent.fixtures.loader import Fixture
from agent.main_loop import Agent, carry_over
from agent.publish.device_builder import build_device, device_object, node_resources
from apis.device import Device
from tests.agent.support import FIXTURES, copy_fixture, wait_for


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _agent(folder: Path, clock: Clock, **cfg: float) -> tuple[Agent, Fixture]:
    config = AgentConfig()
    for key, value in cfg.items():
        setattr(config.health, key, value)
    fx = Fixture.load(folder)
    return Agent(node_name="n", nvml=fx.nvml, sysfs_root=fx.sys_root, config=config, clock=clock), fx


def _gpu(result, minor: int) -> dict:
    doc = device_object(result.device)
    return next(d for d in doc["spec"]["devices"] if d["type"] == "gpu" and d["minor"] == minor)


def test_critical_xid_marks_the_gpu_unhealthy_until_it_has_been_quiet(tmp_path: Path) -> None:
    clock = Clock()
    agent, fx = _agent(FIXTURES / "dgx-h100", clock, xid_hold_seconds=300)
    agent.run_once()
    watcher = EventWatcher(
        fx.nvml, agent.discoverer.gpu_indices, agent.book, ignored_xids=(13, 31, 43, 45, 68, 109), wait_ms=50
    )
    watcher.start()
    try:
        assert watcher.ready.wait(3)
        fx.nvml.emit(2, 13)  # an application Xid: ignored
        fx.nvml.emit(3, 79)  # fallen off the bus
        assert wait_for(lambda: agent.book.changed.is_set(), 3.0)
        result = agent.run_once()
        assert _gpu(result, 2)["health"] is True
        gpu3 = _gpu(result, 3)
        assert gpu3["health"] is False
        assert gpu3["conditions"][0]["reason"] == "XidCriticalError"
        assert "Xid 79" in gpu3["conditions"][0]["message"]
        status = next(s for s in device_object(result.device)["status"]["devices"] if s["minor"] == 3)
        assert status["lastXid"] == 79 and status["reason"] == "XidCriticalError"
        assert result.extended["koordinator.sh/gpu-core"] == "700"  # only healthy GPUs count
        clock.t += 299
        assert _gpu(agent.run_once(), 3)["health"] is False
        clock.t += 2  # quiet for the hold time and answering NVML: back
        recovered = _gpu(agent.run_once(), 3)
        assert recovered["health"] is True and recovered["conditions"][0]["reason"] == "Ready"
    finally:
        watcher.stop()
        watcher.join(2)
        agent.shutdown()


def test_double_bit_ecc_event_is_critical() -> None:
    clock = Clock()
    agent, fx = _agent(FIXTURES / "dgx-h100", clock)
    agent.run_once()
    watcher = EventWatcher(fx.nvml, agent.discoverer.gpu_indices, agent.book, ignored_xids=(), wait_ms=50)
    watcher.start()
    try:
        assert watcher.ready.wait(3)
        fx.nvml.emit(6, 0, event_type=fx.nvml.nvmlEventTypeDoubleBitEccError)
        assert wait_for(lambda: agent.book.changed.is_set(), 3.0)
        assert _gpu(agent.run_once(), 6)["conditions"][0]["reason"] == "DoubleBitEccError"
    finally:
        watcher.stop()
        watcher.join(2)
        agent.shutdown()


def test_nvml_error_on_one_gpu_marks_only_that_gpu_and_it_comes_back() -> None:
    clock = Clock()
    agent, fx = _agent(FIXTURES / "dgx-h100", clock)
    first = agent.run_once()
    before = _gpu(first, 5)
    fx.nvml.fail(5, "nvmlDeviceGetMemoryInfo", "UNKNOWN")
    clock.t += 10
    result = agent.run_once()
    gpu5 = _gpu(result, 5)
    assert gpu5["health"] is False and gpu5["conditions"][0]["reason"] == "NVMLError"
    assert gpu5["conditions"][0]["message"] == "Unknown Error"
    # everything known about it is still published
    assert gpu5["topology"] == before["topology"] and gpu5["nvlink"] == before["nvlink"]
    assert sum(1 for d in result.device.devices if d.type == "gpu" and d.health) == 7
    fx.nvml.restore(5)
    clock.t += 10
    again = _gpu(agent.run_once(), 5)
    assert again["health"] is True
    assert again["conditions"][0]["lastTransitionTime"] != gpu5["conditions"][0]["lastTransitionTime"]
    agent.shutdown()


def test_a_lost_gpu_keeps_its_facts_and_a_missing_one_is_dropped_after_the_grace() -> None:
    clock = Clock()
    agent, fx = _agent(FIXTURES / "dgx-h100", clock, missing_grace_seconds=60)
    agent.run_once()
    fx.nvml.lose(7)  # Xid 79 territory: every call fails, including the handle
    clock.t += 10
    lost = _gpu(agent.run_once(), 7)
    assert lost["health"] is False and lost["conditions"][0]["message"] == "GPU is lost"
    assert lost["id"].startswith("GPU-")
    # the driver stops listing it at all (NVML renumbers): unhealthy "Missing", then gone
    fx.nvml.restore(7)
    fx.nvml.unplug(7)
    clock.t += 10
    missing = _gpu(agent.run_once(), 7)
    assert missing["health"] is False and missing["conditions"][0]["reason"] == "Missing"
    clock.t += 61
    result = agent.run_once()
    assert sorted(d.minor for d in result.device.devices if d.type == "gpu") == list(range(7))
    agent.shutdown()


def test_no_nvml_library_keeps_running_and_never_empties_a_good_device() -> None:
    clock = Clock()
    good = device_object(_agent(FIXTURES / "dgx-h100", clock)[0].run_once().device)
    # the node comes back with a broken driver: the new agent cannot init NVML
    broken = Fixture.load(FIXTURES / "dgx-h100")
    broken.nvml.fail_init("DRIVER_NOT_LOADED")
    agent = Agent(
        node_name="n", nvml=broken.nvml, sysfs_root=broken.sys_root, config=AgentConfig(), clock=clock
    )
    snap = agent.discoverer.discover()
    assert not snap.nvml_available and snap.nvml_reason == "Driver Not Loaded"
    fresh = build_device(snap, agent_ref("n"), AgentConfig())
    assert [d.type for d in fresh.devices] == ["rdma"] * 12  # NICs still discovered
    kept = carry_over(Device.from_dict(good), fresh, snap, clock())
    gpus = [d for d in kept.devices if d.type == "gpu"]
    assert len(gpus) == 8 and not any(g.health for g in gpus)
    assert {g.conditions[0].reason for g in gpus} == {"NVMLUnavailable"}
    assert kept.labels["node.koordinator.sh/gpu-model"] == "H100-80GB-HBM3"
    assert node_resources(kept)["koordinator.sh/gpu-core"] is None  # nothing schedulable on them


def agent_ref(name: str):
    from agent.publish.device_builder import NodeRef

    return NodeRef(name)


def test_odd_and_unreadable_sysfs_files_become_unknowns_with_a_reason(tmp_path: Path) -> None:
    folder = copy_fixture("dgx-h100", tmp_path)
    sys_root = folder / "sys"
    gpu0 = Sysfs(sys_root).pci_path("0000:1b:00.0")
    (sys_root / gpu0 / "numa_node").write_text("zero\n")  # odd content
    nic0 = Sysfs(sys_root).pci_path("0000:18:00.0")
    os.remove(sys_root / nic0 / "numa_node")
    os.mkdir(sys_root / nic0 / "numa_node")  # reading it fails with an OSError
    rate = next((sys_root / nic0 / "infiniband/mlx5_0/ports/1").glob("rate"))
    rate.write_bytes(b"\xff\xfe")  # not text
    os.remove(sys_root / "bus/pci/devices/0000:df:00.0")  # GPU7's node vanished from bus/pci
    result = Agent(
        node_name="n", nvml=Fixture.load(folder).nvml, sysfs_root=sys_root, config=AgentConfig()
    ).run_once()
    doc = device_object(result.device)
    gpus = [d for d in doc["spec"]["devices"] if d["type"] == "gpu"]
    nic0_doc = next(d for d in doc["spec"]["devices"] if d.get("id") == "0000:18:00.0")
    assert gpus[0]["topology"]["nodeID"] == -1  # unknown, not 0
    assert nic0_doc["topology"]["nodeID"] == -1 and "speedGbps" not in nic0_doc["labels"]
    assert gpus[7]["health"] is True and gpus[7]["topology"]["pcieID"] == ""
    assert gpus[7]["conditions"][0]["reason"] == "TopologyIncomplete"
    problems = " ".join(result.snapshot.problems)
    assert "unexpected content 'zero'" in problems and "numa_node: unreadable" in problems
    assert "not text" in problems and "0000:df:00.0: not in bus/pci/devices" in problems
    assert len(gpus) == 8  # nothing dropped


def test_numa_nodes_come_from_the_kernels_online_list(tmp_path: Path) -> None:
    """`node/online` names the nodes, including one whose CPU list is unknown; an odd list falls
    back to the nodeN directories and says so."""
    sys_root = copy_fixture("dgx-h100", tmp_path) / "sys"
    assert Sysfs(sys_root).numa_nodes() == {0: "0-55,112-167", 1: "56-111,168-223"}
    (sys_root / "devices/system/node/online").write_text("0-2\n")  # node2: memory only, no cpulist
    reader = Sysfs(sys_root)
    assert reader.numa_nodes() == {0: "0-55,112-167", 1: "56-111,168-223", 2: ""}
    assert reader.numa_sockets() == {0: 0, 1: 1, 2: -1}
    (sys_root / "devices/system/node/online").write_text("0-x\n")
    reader = Sysfs(sys_root)
    assert sorted(reader.numa_nodes()) == [0, 1]
    assert "devices/system/node/online: odd list '0-x'" in reader.problems


def test_health_book_keeps_transition_time_while_the_verdict_holds() -> None:
    clock = Clock()
    book = HealthBook(xid_hold_seconds=10, clock=clock)
    first = book.update(("gpu", "u"), True, "Ready")
    clock.t += 5
    assert book.update(("gpu", "u"), True, "Ready").since == first.since
    clock.t += 5
    assert book.update(("gpu", "u"), False, "NVMLError", "x").since == clock.t


@pytest.mark.parametrize("name", ["rtx-a6000-nvlink-bridge", "dgx-h100"])
def test_discovery_is_repeatable(name: str) -> None:
    fx = Fixture.load(FIXTURES / name)
    d = Discoverer(fx.nvml, fx.sys_root, AgentConfig(), clock=Clock())
    a, b = d.discover(), d.discover()
    assert [g.facts for g in a.topology.gpus] == [g.facts for g in b.topology.gpus]


def test_a_removed_nic_is_missing_for_the_grace_then_dropped(tmp_path: Path) -> None:
    clock = Clock()
    folder = copy_fixture("dgx-h100", tmp_path)
    agent, _ = _agent(folder, clock, missing_grace_seconds=60)
    agent.run_once()
    os.remove(folder / "sys/class/infiniband/mlx5_4")  # hot-unplugged
    clock.t += 10
    nic = next(
        d for d in device_object(agent.run_once().device)["spec"]["devices"] if d.get("id") == "0000:4f:00.0"
    )
    assert nic["health"] is False and nic["conditions"][0]["reason"] == "Missing"
    clock.t += 61
    ids = [d.id for d in agent.run_once().device.devices if d.type == "rdma"]
    assert "0000:4f:00.0" not in ids and len(ids) == 11
    agent.shutdown()
