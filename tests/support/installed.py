"""Stand-ins for the pods `topoalloc install` creates, on a control plane without kubelet: each runs
the process the pod would run, with what the installation put in the cluster (the ServiceAccount
tokens its RBAC governs, the TLS Secrets, the ConfigMaps), so a test of the installer exercises
exactly what it installed. No pytest here.

* the allocator: `topoalloc allocator --config <ConfigMap topoalloc-allocator>` as the pod named
  by the Deployment (POD_NAME: the leader labels that pod, the Service selects it);
* an agent per DaemonSet pod: `topoalloc agent --fixture` with a token bound to that pod (it
  carries the node name the admission policy checks);
* the secondary scheduler: the kube-scheduler binary of the release with the ConfigMap
  topoalloc-scheduler's configuration and the topoalloc-scheduler ServiceAccount, calling the
  allocator through a loopback forwarder that plays the Service (TLS still checks the Service's
  DNS name).
"""

from __future__ import annotations

import base64
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml

from tests.support.cluster_product import (
    AgentProcess,
    Forwarder,
    service_account_token,
    topoalloc_argv,
)
from tests.support.controlplane import HOST, ControlPlane, Process, free_port, wait_until
from tests.support.processes import warnings_off

NAMESPACE = "topoalloc-system"
SERVICE_DNS = "topoalloc-allocator.topoalloc-system.svc"


def secret_files(cp: ControlPlane, name: str, folder: Path) -> Path:
    """The Secret's keys written as files (mode 600) in `folder`."""
    secret = cp.admin.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}")
    folder.mkdir(parents=True, exist_ok=True)
    for key, value in (secret.get("data") or {}).items():
        path = folder / key
        path.write_bytes(base64.b64decode(value))
        path.chmod(0o600)
    return folder


def pods(cp: ControlPlane, app: str) -> list[dict[str, Any]]:
    """The live (not terminating) pods of one of the installed workloads."""
    items = cp.admin.get(
        f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=f"app.kubernetes.io/name={app}"
    )["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def finish_terminating(cp: ControlPlane, namespace: str = NAMESPACE) -> int:
    """What kubelet does for a deleted pod once its containers stopped: remove it (grace 0)."""
    done = 0
    for pod in cp.admin.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        if pod["metadata"].get("deletionTimestamp"):
            with contextlib.suppress(Exception):
                cp.admin.delete(
                    f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}", gracePeriodSeconds=0
                )
                done += 1
    return done


@dataclass
class Installed:
    """The processes standing in for the installed pods."""

    cp: ControlPlane
    workdir: Path
    fixtures: dict[str, str]  # node -> hw-fixtures name its agent replays
    allocator: Process | None = None
    allocator_ports: dict[str, int] = field(default_factory=dict)
    scheduler: Process | None = None
    agents: dict[str, AgentProcess] = field(default_factory=dict)
    forwarder: Forwarder | None = None

    def processes(self) -> Iterator[Process]:
        for proc in (self.allocator, self.scheduler, *(a.process for a in self.agents.values())):
            if proc is not None:
                yield proc

    def logs(self, lines: int = 40) -> str:
        return "\n".join(p.tail(lines) for p in self.processes())

    def stop(self) -> None:
        for proc in self.processes():
            proc.stop()
        self.agents.clear()
        self.allocator = self.scheduler = None
        if self.forwarder is not None:
            self.forwarder.close()
            self.forwarder = None

    # -- the allocator Deployment -------------------------------------------------------------------

    def start_allocator(self) -> Process:
        """The allocator as its Deployment's first pod runs it, until its cache is synced and it leads."""
        self.stop_allocator()
        pod = sorted(pods(self.cp, "topoalloc-allocator"), key=lambda p: p["metadata"]["name"])[0]
        name = pod["metadata"]["name"]
        tls = secret_files(self.cp, "topoalloc-allocator-tls", self.workdir / "allocator-tls")
        config = self.cp.admin.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/topoalloc-allocator")
        config_file = self.workdir / "allocator.yaml"
        config_file.write_text(config["data"]["allocator.yaml"])
        token = service_account_token(self.cp, NAMESPACE, "topoalloc-allocator")
        kubeconfig = self.cp.write_kubeconfig("installed-allocator", token=token)
        ports = {"port": free_port(), "health": free_port(), "webhook": free_port()}
        # The installed config as is; only what differs outside a pod is given by flags: the API
        # server (no in-cluster service account), the TLS files' paths, loopback ports.
        argv = topoalloc_argv(
            "allocator",
            "--config",
            str(config_file),
            "--no-in-cluster",
            "--kubeconfig",
            str(kubeconfig),
            "--tls-cert",
            str(tls / "tls.crt"),
            "--tls-key",
            str(tls / "tls.key"),
            "--client-ca",
            str(tls / "ca.crt"),
            "--host",
            HOST,
            "--port",
            str(ports["port"]),
            "--health-host",
            HOST,
            "--health-port",
            str(ports["health"]),
            "--webhook-host",
            HOST,
            "--webhook-port",
            str(ports["webhook"]),
            "--lease-duration",
            "6",
            "--renew-deadline",
            "4",
            "--retry-period",
            "1",
            "-vv",
        )
        env = {**os.environ, "POD_NAME": name, "POD_NAMESPACE": NAMESPACE}
        proc = Process("installed-allocator", argv, self.workdir / "installed-allocator.log", env=env).start()
        self.allocator, self.allocator_ports = proc, ports
        http = urllib3.PoolManager(retries=False, timeout=5)
        wait_until(
            lambda: http.request("GET", f"http://{HOST}:{ports['health']}/readyz").status == 200,
            timeout=120,
            what="the installed allocator leading with a synced cache",
            process=proc,
        )
        return proc

    def stop_allocator(self) -> None:
        if self.allocator is not None:
            self.allocator.stop()
            self.allocator = None

    def _extender_port(self) -> int | None:
        alive = self.allocator is not None and self.allocator.alive()
        return self.allocator_ports.get("port") if alive else None

    # -- the agent DaemonSet ------------------------------------------------------------------------

    def start_agents(self) -> dict[str, AgentProcess]:
        """An agent for every node the DaemonSet has a pod on (and none elsewhere)."""
        for pod in pods(self.cp, "topoalloc-agent"):
            node = pod["spec"].get("nodeName")
            if not node or node in self.agents:
                continue
            token = service_account_token(self.cp, NAMESPACE, "topoalloc-agent", bound_pod=pod)
            kubeconfig = self.cp.write_kubeconfig(f"installed-agent-{node}", token=token)
            self.agents[node] = AgentProcess(self.fixtures[node], node, kubeconfig, self.workdir).start()
        return self.agents

    def stop_agents(self) -> None:
        for agent in self.agents.values():
            agent.process.stop()
        self.agents.clear()

    # -- the secondary scheduler Deployment ---------------------------------------------------------

    def stop_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
            self.scheduler = None

    def start_scheduler(self) -> Process:
        assert self.cp.bin_dir is not None
        if self.forwarder is None:
            self.forwarder = Forwarder(self._extender_port)
        client = secret_files(self.cp, "topoalloc-scheduler-client", self.workdir / "scheduler-client")
        installed = self.cp.admin.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/topoalloc-scheduler")
        config = yaml.safe_load(installed["data"]["config.yaml"])
        token = service_account_token(self.cp, NAMESPACE, "topoalloc-scheduler")
        config["clientConnection"] = {
            "kubeconfig": str(self.cp.write_kubeconfig("installed-scheduler", token=token))
        }
        for extender in config["extenders"]:
            # The Service's name does not resolve here: the forwarder plays it, TLS checks the name.
            assert extender["urlPrefix"] == f"https://{SERVICE_DNS}:8443", extender["urlPrefix"]
            extender["urlPrefix"] = f"https://{HOST}:{self.forwarder.port}"
            tls = extender["tlsConfig"]
            tls["serverName"] = SERVICE_DNS
            for key, name in (("caFile", "ca.crt"), ("certFile", "tls.crt"), ("keyFile", "tls.key")):
                assert Path(tls[key]).name == name, tls
                tls[key] = str(client / name)
        path = self.workdir / "installed-scheduler.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        argv = [
            str(self.cp.bin_dir / "kube-scheduler"),
            f"--config={path}",
            f"--bind-address={HOST}",
            f"--secure-port={port}",
        ]
        proc = Process("installed-scheduler", argv, self.workdir / "installed-scheduler.log").start()
        self.scheduler = proc
        http = urllib3.PoolManager(cert_reqs="CERT_NONE", retries=False, timeout=5)
        with warnings_off():
            wait_until(
                lambda: http.request("GET", f"https://{HOST}:{port}/healthz").data == b"ok",
                timeout=120,
                what="the installed kube-scheduler /healthz",
                process=proc,
            )
        return proc
