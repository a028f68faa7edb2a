"""One node's agent as its own process (fixture mode) with its pods in the fake API server; in
device-plugin mode it serves a stand-in kubelet. What the crash test kills and restarts, what the
device plugin benchmark measures the way a node runs it (kubelet and the agent in two processes),
and what a GPU failure is rehearsed on (`events`: the folder of `--fixture-events`).

Agent processes come from the fork server (tests/support/agent_forkserver.py), so a restart costs a
fraction of a second; each is an ordinary process, SIGKILLed and reaped by PID.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.support.agent_forkserver import AgentForkServer
from tests.support.fakeapi import FakeApiServer
from tests.support.kubelet import StandInKubelet
from tests.support.rest import kubeconfig_text

REPO = Path(__file__).resolve().parents[2]
PLUGIN_RESOURCES = ["nvidia.com/gpu", "koordinator.sh/gpu-core", "koordinator.sh/gpu", "koordinator.sh/rdma"]


class AgentNode:
    def __init__(
        self,
        server: FakeApiServer,
        name: str = "gpu-node",
        *,
        fixture: str = "dgx-h100",
        mode: str = "device-plugin",
        fixture_events: bool = False,
        verbose: bool = True,
    ) -> None:
        self.server = server
        self.name = name
        self.mode = mode
        self.verbose = verbose  # -v: the agent logs each served container (tests read the log)
        self.fixture = REPO / "hw-fixtures" / fixture
        self.root = Path(tempfile.mkdtemp(prefix="node-", dir="/tmp"))  # unix socket paths stay short
        self.state = self.root / "state"
        self.events = self.root / "events" if fixture_events else None
        self.log = self.root / "agent.log"
        (self.root / "kubeconfig").write_text(kubeconfig_text(server.url))
        self.kubelet_config = self.root / "kubelet-config.yaml"  # kubelet's policies: none unless written
        (self.root / "agent.yaml").write_text(
            f"midTier:\n  enabled: false\nkubelet:\n  configFile: {self.kubelet_config}\n"
        )
        for d in ("dev", "cdi", "dp"):
            (self.root / d).mkdir()
        for dev in ("nvidiactl", "nvidia-uvm"):
            (self.root / "dev" / dev).touch()
        server.put(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name},
                "status": {"capacity": {"cpu": "64"}, "allocatable": {"cpu": "64"}},
            }
        )
        self.kubelet = StandInKubelet(self.root / "dp", self.root / "pr.sock").start()
        self.forks = AgentForkServer()
        self.pid = 0
        self.starts = 0

    def argv(self, *extra: str) -> list[str]:
        plugins = (
            [
                "--device-plugin",
                "--device-plugin-dir",
                str(self.root / "dp"),
                "--pod-resources-socket",
                str(self.root / "pr.sock"),
                "--cdi-root",
                str(self.root / "cdi"),
            ]
            if self.mode == "device-plugin"
            else ["--mode", self.mode]
        )
        return [
            "agent",
            "--fixture",
            str(self.fixture),
            "--node-name",
            self.name,
            "--kubeconfig",
            str(self.root / "kubeconfig"),
            "--config",
            str(self.root / "agent.yaml"),
            "--resync",
            "60",
            "--no-hotplug",
            "--health-port",
            "0",
            "--metrics-address",
            "127.0.0.1",
            "--metrics-port",
            "0",
            *plugins,
            *(["--fixture-events", str(self.events)] if self.events is not None else []),
            "--dev-root",
            str(self.root / "dev"),
            "--state-dir",
            str(self.state),
            *(["-v"] if self.verbose else []),
            *extra,
        ]

    def start_agent(self, timeout: float = 20.0) -> None:
        """A new agent process; in device-plugin mode returns once its plugins registered with the
        stand-in kubelet."""
        self.pid = self.forks.start(self.argv(), self.log)
        self.starts += 1
        if self.mode == "device-plugin":
            self.kubelet.wait_registered(PLUGIN_RESOURCES, timeout=timeout, count=self.starts)

    def kill_agent(self) -> None:
        if self.pid:
            self.forks.kill(self.pid)
            self.pid = 0

    def uuid(self, minor: int) -> str:
        device = self.server.get("devices", self.name)
        return next(
            str(d["id"]) for d in device["spec"]["devices"] if d["type"] == "gpu" and d["minor"] == minor
        )

    def put_pod(self, doc: dict[str, Any]) -> dict[str, Any]:
        return self.server.put(doc)

    def set_phase(self, name: str, phase: str, namespace: str = "default") -> None:
        pod = self.server.get("pods", name, namespace)
        pod["status"]["phase"] = phase
        self.server.put(pod)

    def close(self) -> None:
        self.kill_agent()
        self.forks.close()
        self.kubelet.stop()
        shutil.rmtree(self.root, ignore_errors=True)
