"""Rehearsing a GPU failure in fixture mode: NVML events handed to a running agent from outside,
through the `--fixture-events` folder (agent/fixtures/event_inbox.py). The parser and the inbox on
a replay first, then real agent processes: the Device CR, kubelet's ListAndWatch and the DRA slices
all show the GPU unhealthy after one `topoalloc agent inject-event`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.fixtures.event_inbox import DONE, REJECTED, EventError, EventInbox, parse_events, write_event
from agent.fixtures.loader import Fixture
from tests.agent.dra.rig import serve_resource_api
from tests.agent.support import FIXTURES, REPO, wait_for
from tests.support.agent_node import AgentNode
from tests.support.fakeapi import FakeApiServer

H100_3 = "GPU-ed684765-53fb-d6ad-d0f8-2d84dc86b55c"


@pytest.fixture
def nvml():
    replay = Fixture.load(FIXTURES / "dgx-h100").nvml
    replay.nvmlInit()
    return replay


def test_events_by_index_or_uuid(nvml) -> None:
    xid, dbe = parse_events(f'[{{"gpu": 3, "xid": 79}}, {{"gpu": "{H100_3}", "ecc": "double-bit"}}]', nvml)
    assert (xid.index, xid.event_type, xid.data) == (3, nvml.nvmlEventTypeXidCriticalError, 79)
    assert (dbe.index, dbe.event_type) == (3, nvml.nvmlEventTypeDoubleBitEccError)
    assert parse_events("gpu: 0\nxid: 48\n", nvml)[0].data == 48  # YAML, one event alone


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[", "not JSON or YAML"),
        ("[]", "no event"),
        ('{"gpu": 9, "xid": 79}', "no GPU 9 on this fixture"),
        ('{"gpu": "GPU-nope", "xid": 79}', "no GPU 'GPU-nope'"),
        ('{"gpu": 1}', "exactly one of `xid` and `ecc`"),
        ('{"gpu": 1, "xid": 79, "ecc": "double-bit"}', "exactly one of"),
        ('{"gpu": 1, "xid": -1}', "non-negative"),
        ('{"gpu": 1, "ecc": "single-bit"}', "`ecc` is one of"),
        ('{"gpu": 1, "xid": 79, "when": 5}', "unknown keys"),
        ('{"gpu": true, "xid": 79}', "NVML index or a GPU UUID"),
    ],
)
def test_bad_event_files_say_why(nvml, text: str, why: str) -> None:
    with pytest.raises(EventError, match=why):
        parse_events(text, nvml)


def test_the_inbox_waits_for_a_listener_then_delivers_once(nvml, tmp_path: Path) -> None:
    inbox = EventInbox(tmp_path, nvml)
    path = write_event(tmp_path, "xid", [{"gpu": 2, "xid": 79}])
    (tmp_path / ".half.tmp").write_text("{")  # being written: never read
    inbox.step()
    assert path.exists() and inbox.delivered == 0  # nobody listens yet: the file waits
    event_set = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(
        nvml.nvmlDeviceGetHandleByIndex(2), nvml.nvmlEventTypeXidCriticalError, event_set
    )
    inbox.step()
    assert not path.exists() and path.with_name(path.name + DONE).exists()
    got = nvml.nvmlEventSetWait(event_set, 100)
    assert (got.device.index, got.eventData) == (2, 79)
    inbox.step()
    assert inbox.delivered == 1  # a done file is not delivered again

    bad = tmp_path / "bad.json"
    bad.write_text('{"gpu": 2}')
    inbox.step()
    assert (tmp_path / f"bad.json{REJECTED}").exists()
    assert "exactly one of" in (tmp_path / f"bad.json{REJECTED}.reason").read_text()


def test_fixture_events_need_a_fixture() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "topoalloc", "agent", "--fixture-events", "/tmp/x", "--node-name", "n"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "--fixture-events needs --fixture" in out.stderr


def _inject(inbox: Path, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "topoalloc", "agent", "inject-event", str(inbox), *args],
        cwd=REPO,
        check=True,
        capture_output=True,
    )


@pytest.fixture
def plugin_node(fake_api_thread: FakeApiServer) -> Iterator[AgentNode]:
    node = AgentNode(fake_api_thread, fixture_events=True)
    try:
        yield node
    finally:
        node.close()


def _gpu(server: FakeApiServer, node: str, minor: int) -> tuple[dict, dict]:
    device = server.get("devices", node)
    spec = next(d for d in device["spec"]["devices"] if d["type"] == "gpu" and d["minor"] == minor)
    status = next(d for d in device["status"]["devices"] if d["type"] == "gpu" and d["minor"] == minor)
    return spec, status


def test_an_injected_xid_makes_the_gpu_unhealthy_everywhere(plugin_node: AgentNode) -> None:
    node, server = plugin_node, plugin_node.server
    node.start_agent()
    uuid = node.uuid(3)
    assert node.kubelet.plugins["nvidia.com/gpu"].devices[uuid][0] == "Healthy"
    capacity = server.get("nodes", node.name)["status"]["capacity"]["koordinator.sh/gpu-memory-ratio"]
    assert node.events is not None
    _inject(node.events, "--gpu", "3", "--xid", "79")

    node.kubelet.wait_devices("nvidia.com/gpu", lambda d: d[uuid][0] == "Unhealthy", timeout=10)
    cores = node.kubelet.wait_devices(
        "koordinator.sh/gpu-core", lambda d: d[f"{uuid}-u00"][0] == "Unhealthy", timeout=10
    )
    assert all(h == "Unhealthy" for i, (h, _) in cores.items() if i.startswith(uuid))
    assert wait_for(lambda: not _gpu(server, node.name, 3)[0]["health"], 10)
    # the status (with the Xid) is written after the spec, in its own request
    assert wait_for(lambda: _gpu(server, node.name, 3)[1].get("lastXid") == 79, 10)
    spec, _status = _gpu(server, node.name, 3)
    assert spec["conditions"][0]["reason"] == "XidCriticalError"
    assert all(_gpu(server, node.name, m)[0]["health"] for m in (0, 1, 2, 4, 5, 6, 7))
    assert capacity == "800"  # and the Node, patched after the Device, one GPU lower:
    assert wait_for(
        lambda: (
            server.get("nodes", node.name)["status"]["capacity"]["koordinator.sh/gpu-memory-ratio"] == "700"
        ),
        10,
    )
    assert sorted(p.suffix for p in node.events.iterdir()) == [DONE]


def test_an_injected_ecc_error_takes_the_gpu_out_of_the_dra_slices(fake_api_thread: FakeApiServer) -> None:
    serve_resource_api(fake_api_thread)
    node = AgentNode(fake_api_thread, "dra-node", mode="dra", fixture_events=True)
    try:
        node.start_agent()

        def slices() -> list[dict]:
            return [
                s
                for s in fake_api_thread.list_objects("resourceslices")
                if s["spec"]["nodeName"] == node.name
            ]

        def names() -> set[str]:
            return {d["name"] for s in slices() for d in s["spec"]["devices"]}

        assert wait_for(lambda: "gpu-5" in names(), 20)
        assert node.events is not None
        _inject(node.events, "--gpu", "5", "--ecc", "double-bit")
        assert wait_for(lambda: "gpu-5" not in names(), 10)
        assert {f"gpu-{m}" for m in (0, 1, 2, 3, 4, 6, 7)} <= names()
        assert wait_for(
            lambda: _gpu(fake_api_thread, node.name, 5)[0]["conditions"][0]["reason"] == "DoubleBitEccError",
            10,
        )
    finally:
        node.close()
