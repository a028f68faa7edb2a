"""The agent's loop with its threads: health endpoint for the probes, an NVML Xid event republished
at once (not at the next resync), a stall making /healthz fail, clean stop."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

from agent.config import AgentConfig
from agent.fixtures.loader import Fixture
from agent.healthz import HealthServer
from agent.kube import Kube
from agent.main_loop import Agent
from tests.agent.support import FIXTURES, wait_for

NODE = "loop-node"


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_loop_probes_and_xid_events(fake_api_thread, fake_api_sync_client) -> None:
    server = fake_api_thread
    server.put(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE},
            "status": {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}},
        }
    )
    config = AgentConfig(resync_seconds=30)  # events, not the resync, must drive the update
    config.mid_tier.enabled = False
    config.health.event_wait_ms = 50
    fx = Fixture.load(FIXTURES / "dgx-h100")
    agent = Agent(
        node_name=NODE, nvml=fx.nvml, sysfs_root=fx.sys_root, config=config, kube=Kube(fake_api_sync_client)
    )
    health = HealthServer("127.0.0.1", 0, agent.health_state)
    health.start()
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,), kwargs={"hotplug": False})
    loop.start()
    try:
        assert wait_for(lambda: server.get("devices", NODE) is not None, 10)
        assert _get(health.port, "/healthz") == (200, "ok\n")
        assert wait_for(lambda: _get(health.port, "/readyz")[0] == 200, 5)
        status = json.loads(_get(health.port, "/status")[1])
        assert status["gpus"] == 8 and status["rdma"] == 12 and status["nvml"] == "ok"
        assert _get(health.port, "/nope")[0] == 404

        assert wait_for(lambda: agent.events.ready.is_set(), 5)
        sent = time.monotonic()
        fx.nvml.emit(6, 48)  # double-bit ECC Xid
        assert wait_for(lambda: server.get("devices", NODE)["status"]["devices"][6]["health"] is False, 2)
        assert time.monotonic() - sent < 2
        assert server.get("devices", NODE)["spec"]["devices"][6]["health"] is False
        entry = server.get("devices", NODE)["status"]["devices"][6]
        assert entry["reason"] == "XidCriticalError" and entry["lastXid"] == 48
    finally:
        stop.set()
        loop.join(10)
    try:
        assert not loop.is_alive()
        # a main loop that stopped passing fails the liveness probe
        agent.last_pass_at -= 1000
        assert _get(health.port, "/healthz")[0] == 503
    finally:
        health.stop()
