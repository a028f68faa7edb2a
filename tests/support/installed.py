"""Stand-ins for the pods `topoalloc install` creates, on a control plane without kubelet: each runs
the process the pod would run, with what the installation put in the cluster (the ServiceAccount
tokens its RBAC governs, the TLS Secrets, the ConfigMaps), so a test of the installer exercises
exactly what it installed. No pytest here.

* the allocator: `topoalloc allocator` with the arguments of the Deployment's current pod and the
  ConfigMap topoalloc-allocator as its `--config`, as the pod named by the Deployment (POD_NAME:
  the leader labels that pod, the Service selects it);
* an agent per DaemonSet pod: `topoalloc agent --fixture` with a token bound to that pod (it
  carries the node name the admission policy checks);
* the Services' endpoints (ClusterNetwork): kube-apiserver calls the installed webhook
  configuration as installed (`clientConfig.service`, the caBundle the allocator keeps): it resolves
  the Service to its ClusterIP and, where kube-proxy and pod IPs would carry the connection on a
  cluster, goes through a loopback HTTP CONNECT proxy (its egress selector's `cluster` network, as
  with Konnectivity) that connects to the allocator process, the Service's endpoint;
* kubelet's status reports (`kubelet=True`): the pod a started process plays is reported Running
  and Ready (as kubelet does once its readiness probe passes), and not ready once the process is
  stopped, so the Deployment's and DaemonSet's status count what runs (`install --wait`, doctor);
* the secondary scheduler (`--mode secondary` only; in placement mode the control plane's own
  kube-scheduler binds): the kube-scheduler binary of the release with the ConfigMap
  topoalloc-scheduler's configuration and the topoalloc-scheduler ServiceAccount, calling the
  allocator through a loopback forwarder that plays the Service (TLS still checks the Service's
  DNS name).
"""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml

from tests.support.cluster_product import (
    AgentProcess,
    Forwarder,
    relay,
    service_account_token,
    topoalloc_argv,
)
from tests.support.controlplane import (
    HOST,
    ApiStatus,
    ControlPlane,
    Process,
    free_port,
    free_ports,
    wait_until,
)
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


class ClusterNetwork:
    """kube-apiserver's way into the cluster's network: an HTTP CONNECT proxy on a unix socket (what
    a Konnectivity server is to a real control plane) that kube-apiserver's egress selector sends
    its `cluster` connections to, a webhook's Service included. `CONNECT <ClusterIP>:<port>` is
    answered by connecting to `endpoint(ip, port)`, the loopback port of the process playing one of
    the Service's pods (None: the Service has no endpoint, and kube-apiserver's call fails as it
    would on a cluster). So the installed webhook configuration is called as it is: pointing it at
    a loopback URL instead would fail TLS, the installed certificate naming the Services only, and
    would bypass the caBundle the allocator keeps. A unix socket: kube-apiserver's TCP transport to
    a proxy requires TLS with a client certificate. Make it before the control plane
    (`egress_flag`); `endpoint` may be set later."""

    def __init__(self, folder: Path, endpoint: Callable[[str, int], int | None] | None = None) -> None:
        self.endpoint = endpoint
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.path = folder / "proxy.sock"
        self.path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        self.sock.listen(64)
        self._thread = threading.Thread(target=self._accept, name="cluster-network", daemon=True)
        self._thread.start()

    def egress_flag(self) -> str:
        """kube-apiserver's flag for an EgressSelectorConfiguration naming this proxy."""
        config = {
            "apiVersion": "apiserver.k8s.io/v1beta1",
            "kind": "EgressSelectorConfiguration",
            "egressSelections": [
                {
                    "name": "cluster",
                    "connection": {
                        "proxyProtocol": "HTTPConnect",
                        "transport": {"uds": {"udsName": str(self.path)}},
                    },
                }
            ],
        }
        path = self.folder / "egress-selector.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return f"--egress-selector-config-file={path}"

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        head = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in head and len(head) < 65536 and (chunk := client.recv(4096)):
                head += chunk
        method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
        host, _, port = rest.partition(" ")[0].rpartition(":")
        upstream = None
        with contextlib.suppress(Exception):
            found = self.endpoint(host, int(port)) if method == "CONNECT" and self.endpoint else None
            if found is not None:
                upstream = socket.create_connection((HOST, found), timeout=5)
        if upstream is None:
            with contextlib.suppress(OSError):
                client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
            client.close()
            return
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        relay(client, upstream)


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
    network: ClusterNetwork | None = None  # kube-apiserver's egress proxy, given the Services' endpoints
    kubelet: bool = False  # report the played pods' status as kubelet would (Ready while running)
    agent_args: tuple[str, ...] = ()  # more flags for every agent
    allocator_pod: str = ""  # the pod `allocator` plays
    standby: Process | None = None  # the allocator Deployment's second pod (start_standby)

    def __post_init__(self) -> None:
        if self.network is not None:
            self.network.endpoint = self._service_endpoint

    def processes(self) -> Iterator[Process]:
        for proc in (
            self.allocator,
            self.standby,
            self.scheduler,
            *(a.process for a in self.agents.values()),
        ):
            if proc is not None:
                yield proc

    def logs(self, lines: int = 40) -> str:
        return "\n".join(p.tail(lines) for p in self.processes())

    def stop(self) -> None:
        for proc in self.processes():
            proc.stop()
        self.agents.clear()
        self.allocator = self.standby = self.scheduler = None
        if self.forwarder is not None:
            self.forwarder.close()
            self.forwarder = None

    def _service_endpoint(self, ip: str, port: int) -> int | None:
        """The loopback port of the process behind the installed Service at ClusterIP `ip`:`port`:
        the allocator's port the Service port targets (every replica serves the webhook; the
        extender's Service selects the leader, and the one allocator here leads). None while it is
        not running."""
        services = self.cp.admin.get(f"/api/v1/namespaces/{NAMESPACE}/services")["items"]
        for service in services:
            spec = service["spec"]
            if spec.get("clusterIP") != ip or not service["metadata"]["name"].startswith("topoalloc-"):
                continue
            for entry in spec.get("ports") or []:
                if entry["port"] == port:
                    role = {"webhook": "webhook", "https": "port"}.get(str(entry.get("targetPort")))
                    alive = self.allocator is not None and self.allocator.alive()
                    return self.allocator_ports.get(role) if role and alive else None
        return None

    # -- the allocator Deployment -------------------------------------------------------------------

    def start_allocator(self) -> Process:
        """The allocator as its Deployment's first pod of the current template runs it (its
        arguments), until its cache is synced and it leads."""
        self.stop_allocator()
        pod = self.current_pod()
        proc, ports = self._allocator(pod, "installed-allocator", leads=True)
        self.allocator, self.allocator_ports, self.allocator_pod = proc, ports, pod["metadata"]["name"]
        return proc

    def start_standby(self) -> Process:
        """The allocator as the Deployment's second pod runs it: a hot standby, ready once synced."""
        self.stop_standby()
        other = wait_until(
            lambda: next(
                (p for p in self.current_pods() if p["metadata"]["name"] != self.allocator_pod), None
            ),
            timeout=120,
            what="a second allocator pod of the current template",
        )
        self.standby, _ = self._allocator(other, "installed-standby", leads=False)
        return self.standby

    def stop_standby(self) -> None:
        if self.standby is not None:
            self.standby.stop()
            self.standby = None

    def _allocator(self, pod: dict[str, Any], label: str, *, leads: bool) -> tuple[Process, dict[str, int]]:
        name = pod["metadata"]["name"]
        args = list(pod["spec"]["containers"][0]["args"])
        assert args[0] == "allocator" and "--config" in args, args
        tls = secret_files(self.cp, "topoalloc-allocator-tls", self.workdir / "allocator-tls")
        config = self.cp.admin.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/topoalloc-allocator")
        config_file = self.workdir / "allocator.yaml"
        config_file.write_text(config["data"]["allocator.yaml"])
        token = service_account_token(self.cp, NAMESPACE, "topoalloc-allocator")
        kubeconfig = self.cp.write_kubeconfig("installed-allocator", token=token)
        ports = dict(zip(("port", "health", "webhook"), free_ports(3), strict=True))
        # The pod's arguments and the installed config as they are; only what differs outside a
        # pod is given by flags: the config's and the TLS files' paths, the API server (no
        # in-cluster service account), loopback ports.
        args[args.index("--config") + 1] = str(config_file)
        argv = topoalloc_argv(
            *args,
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
        proc = Process(label, argv, self.workdir / f"{label}.log", env=env).start()
        http = urllib3.PoolManager(retries=False, timeout=5)
        probe, what = ("readyz", "leading with a synced cache") if leads else ("syncz", "synced (standby)")
        wait_until(
            lambda: http.request("GET", f"http://{HOST}:{ports['health']}/{probe}").status == 200,
            timeout=120,
            what=f"the installed allocator {what}",
            process=proc,
        )
        self.report(pod, running=True)
        return proc, ports

    def current_pods(self) -> list[dict[str, Any]]:
        """The allocator Deployment's live pods of its current template, by name."""
        path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/topoalloc-allocator"
        finish_terminating(self.cp)
        (wanted,) = self.cp.admin.get(path)["spec"]["template"]["spec"]["containers"]
        current = [
            p
            for p in pods(self.cp, "topoalloc-allocator")
            if (c := p["spec"]["containers"][0])["args"] == wanted["args"] and c["image"] == wanted["image"]
        ]
        return sorted(current, key=lambda p: p["metadata"]["name"])

    def current_pod(self) -> dict[str, Any]:
        """The allocator Deployment's first live pod of its current template (after a rollout,
        once kubelet's part is done: the old pods removed)."""
        return wait_until(
            lambda: next(iter(self.current_pods()), None),
            timeout=120,
            what="an allocator pod of the Deployment's current template",
        )

    def stop_allocator(self) -> None:
        if self.allocator is not None:
            self.allocator.stop()
            self.allocator = None

    # -- kubelet's status reports -------------------------------------------------------------------

    def report(self, pod: dict[str, Any], *, running: bool) -> None:
        """What kubelet reports of a pod whose process runs (Running, Ready, an IP) or stopped (its
        container terminated, not ready); nothing unless `kubelet`, or once the pod is gone."""
        if not self.kubelet:
            return
        name = pod["metadata"]["name"]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        state = (
            {"running": {"startedAt": now}}
            if running
            else {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now}}
        )
        flag = "True" if running else "False"
        ip = f"10.244.{sum(name.encode()) % 250}.{len(name) % 250 + 2}"
        status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": pod["metadata"].get("creationTimestamp") or now,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
                {"type": "Ready", "status": flag, "lastTransitionTime": now},
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": "",
                    "ready": running,
                    "started": running,
                    "restartCount": 0,
                    "state": state,
                }
                for c in pod["spec"]["containers"]
            ],
        }
        try:
            self.cp.admin.merge_patch(
                f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/status", {"status": status}
            )
        except ApiStatus as exc:
            if exc.status != 404:  # gone meanwhile: nothing to report
                raise

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
            agent = AgentProcess(self.fixtures[node], node, kubeconfig, self.workdir, more=self.agent_args)
            self.agents[node] = agent.start()
            self.report(pod, running=True)
        return self.agents

    def stop_agent(self, node: str) -> None:
        agent = self.agents.pop(node)
        agent.process.stop()
        for pod in pods(self.cp, "topoalloc-agent"):
            if pod["spec"].get("nodeName") == node:
                self.report(pod, running=False)

    def stop_agents(self) -> None:
        for node in list(self.agents):
            self.stop_agent(node)

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
