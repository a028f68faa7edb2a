"""Restarts: kubelet's (plugins re-register within seconds on fresh sockets) and the agent's (its
msgpack checkpoint brings back the served pods, the Xid history and the mid-tier window)."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from agent import checkpoint
from agent.config import MidTierConfig
from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2 as pb
from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from agent.deviceplugin.service import DevicePluginService, DevicePluginSettings
from agent.discovery.device_health import HealthBook
from agent.midtier.pod_watch import PodInfo
from agent.midtier.reclaimable import MidTier
from agent.parts import NoMidTier
from tests.agent.deviceplugin.rig import allocated, gpu_entry
from tests.agent.deviceplugin.test_kubelet_flow import H100, _wait
from tests.agent.test_midtier import GI, Clock, _write_cgroup

RESOURCES = ["koordinator.sh/gpu", "koordinator.sh/gpu-core", "koordinator.sh/rdma", "nvidia.com/gpu"]


def test_kubelet_restart_re_registers_within_seconds(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    a = rig.put_pod("before", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(2, H100[2])]))
    assert kubelet.admit(a)["main"]["nvidia.com/gpu"].ids == [H100[2]]

    started = time.monotonic()
    kubelet.restart()  # deletes every plugin socket, new kubelet.sock
    kubelet.wait_registered(RESOURCES, timeout=10, count=2)
    took = time.monotonic() - started
    assert took < 5, took
    assert len(kubelet.registrations) == 8
    assert sorted(p.name for p in rig.plugin_dir.iterdir()) == [
        "kubelet.sock",
        "topoalloc-koordinator.sh-gpu-core.sock",
        "topoalloc-koordinator.sh-gpu.sock",
        "topoalloc-koordinator.sh-rdma.sock",
        "topoalloc-nvidia.com-gpu.sock",
    ]
    # the kubelet kept its allocations; the next pod is served through the new connection
    b = rig.put_pod("after", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(5, H100[5])]))
    got = kubelet.admit(b)["main"]["nvidia.com/gpu"]
    assert got.ids == [H100[5]] and got.envs == {"NVIDIA_VISIBLE_DEVICES": H100[5]}


def test_agent_restart_keeps_served_pods_and_xid_history(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    agent = rig.start_agent()
    a = rig.put_pod("served", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(3, H100[3])]))
    kubelet.admit(a)
    assert _wait(lambda: agent.events.ready.is_set())
    assert rig.fx is not None
    rig.fx.nvml.emit(6, 48)
    kubelet.wait_devices("nvidia.com/gpu", lambda d: d[H100[6]][0] == "Unhealthy", timeout=10)
    rig.stop_agent()

    saved = checkpoint.load(rig.state / checkpoint.FILE_NAME)
    assert saved is not None
    state, _ = saved
    assert [s["name"] for s in state["served"].values()] == ["served"]
    assert state["xid"]["last"] == {H100[6]: 48}

    # the pod runs now; a new agent on the same state dir
    pod = rig.server.get("pods", "served", "default")
    pod["status"]["phase"] = "Running"
    rig.server.put(pod)
    agent2 = rig.start_agent(wait=False)
    kubelet.wait_registered(RESOURCES, timeout=10, count=2)
    assert [s.name for s in agent2.device_plugins.admission.served.values()] == ["served"]
    assert agent2.book.last_xid(H100[6]) == 48
    # the Xid still holds GPU 6 unhealthy after the restart (it is not forgotten with the process)
    devices = kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == 8)
    assert devices[H100[6]][0] == "Unhealthy"

    # a kubelet that lost its own state offers GPU 3 again: the agent still refuses to hand it out
    kubelet.forget()
    twice = rig.put_pod("twice", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(3, H100[3])]))
    from tests.support.kubelet import AdmissionError

    with pytest.raises(AdmissionError, match="already serve another pod"):
        kubelet.admit(twice)


def _settings(state: Path) -> DevicePluginSettings:
    return DevicePluginSettings(plugin_dir=str(state / "dp"), state_dir=str(state))


def test_restarted_agent_keeps_its_mid_tier_window(tmp_path: Path) -> None:
    clock = Clock()
    cfg = MidTierConfig(cgroup_root=str(tmp_path / "cg"), window_seconds=600, min_samples=2, safe_margin=0.0)
    pod = PodInfo("aaaa-1111", "ns/a", 9500, "Guaranteed", "Running", 8000, 16 * GI)
    mid = MidTier(cfg, node_usage=lambda: (1000, GI), clock=clock)
    for i, (usec, mem) in enumerate([(0, 6), (2_000_000, 9), (3_000_000, 7)]):
        clock.t = 1000.0 + 10 * i
        _write_cgroup(tmp_path / "cg", pod, usec, mem * GI, 0, systemd=True)
        mid.sample([pod])
    peak = mid._peak(pod)
    assert peak == (200, 9 * GI)  # 2 s of CPU over 10 s = 200 milli-cores; 9 GiB working set

    service = DevicePluginService(_settings(tmp_path), node_name="n", sysfs_root=tmp_path, kube=None)
    service.attach(mid=mid, book=HealthBook(xid_hold_seconds=300))
    service.save()

    restarted = MidTier(cfg, node_usage=lambda: (1000, GI), clock=Clock())  # a new process: new clock
    service2 = DevicePluginService(_settings(tmp_path), node_name="n", sysfs_root=tmp_path, kube=None)
    service2.attach(mid=restarted, book=HealthBook(xid_hold_seconds=300))
    assert restarted._peak(pod) == peak
    fresh = MidTier(cfg, node_usage=lambda: (1000, GI), clock=Clock())
    assert fresh._peak(pod) == (8000, 16 * GI)  # without the checkpoint: the request, no reclaim


@pytest.mark.parametrize(
    "content",
    [
        b"\xc1 not msgpack",
        b"",
        b"\x92\x01",  # truncated array
        checkpoint.msgpack.packb({"version": 99, "savedAt": 1.0, "state": {}}),
        checkpoint.msgpack.packb({"version": 1, "savedAt": 1.0, "state": "nope"}),
        checkpoint.msgpack.packb([1, 2, 3]),
        checkpoint.msgpack.packb(
            {"version": 1, "savedAt": 1.0, "state": {"served": {"u": {"resources": {"r": "x"}}}, "xid": 5}}
        ),
    ],
)
def test_bad_checkpoint_is_discarded_with_a_warning(tmp_path: Path, content: bytes, caplog) -> None:
    (tmp_path / checkpoint.FILE_NAME).write_bytes(content)
    service = DevicePluginService(_settings(tmp_path), node_name="n", sysfs_root=tmp_path, kube=None)
    book = HealthBook(xid_hold_seconds=300)
    service.attach(mid=NoMidTier(), book=book)
    assert service.admission.served == {}
    assert book.export_xids() == {"marks": {}, "last": {}}
    assert any(r.levelname == "WARNING" and "checkpoint" in r.getMessage() for r in caplog.records)
    service.save()  # and the next save replaces it with a good one
    assert checkpoint.load(tmp_path / checkpoint.FILE_NAME) is not None


def test_checkpoint_write_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / checkpoint.FILE_NAME
    checkpoint.save(path, {"served": {}, "n": 1})
    checkpoint.save(path, {"served": {}, "n": 2})
    assert checkpoint.load(path)[0]["n"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.FILE_NAME]  # no temp file left


def test_allocate_without_a_pod_fails_closed_over_grpc(make_rig) -> None:
    """A direct Allocate (no pending pod wants this) is FAILED_PRECONDITION with the reason."""
    rig = make_rig("dgx-h100")
    rig.start_kubelet()
    rig.start_agent(wait_for=("nvidia.com/gpu",))
    channel = grpc.insecure_channel(f"unix://{rig.plugin_dir / 'topoalloc-nvidia.com-gpu.sock'}")
    stub = pb_grpc.DevicePluginStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[H100[0]])])
        )
    channel.close()
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (
        err.value.details() == "topoalloc: no pod kubelet is admitting on this node requests nvidia.com/gpu"
    )
