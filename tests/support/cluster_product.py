"""topoalloc's own processes against a real control plane, started the way users start them: the
`topoalloc` console script (`certs`, `allocator`, `agent --fixture`), plus a TCP forwarder that
plays the Services in front of the allocator (leader-only for the extender, any replica for the
gang webhook). No pytest here, so bench/ scripts can import it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import urllib3
import yaml

from tests.support.controlplane import (
    HOST,
    REPO,
    ApiStatus,
    ControlPlane,
    Process,
    free_ports,
    wait_until,
)

FIXTURES = REPO / "hw-fixtures"
SYSTEM_NAMESPACE = "topoalloc-system"
EXTENDER_CLIENT_CN = "kube-scheduler-extender-client"
# The TLS name kube-scheduler checks (deploy/kube-scheduler/kube-scheduler-config.yaml's serverName).
ALLOCATOR_SERVICE_DNS = "topoalloc-allocator.topoalloc-system.svc"


def topoalloc_argv(*args: str) -> list[str]:
    """The installed console script beside this interpreter, else `python -m topoalloc`."""
    script = Path(sys.executable).parent / "topoalloc"
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "topoalloc", *args]


def make_certs(out_dir: Path) -> Path:
    """`topoalloc certs` with an IP SAN for loopback: ca.crt, tls.crt/key, client.crt/key."""
    done = subprocess.run(
        topoalloc_argv("certs", "--out-dir", str(out_dir), "--ip", HOST, "--force"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"topoalloc certs failed: {done.stderr}")
    return out_dir


def tier_round_trips() -> int | None:
    """TOPOALLOC_ROUND_TRIPS=1 or 2 runs kube-scheduler and the allocators in that extender mode
    (docs/service.md, "Round trips"); unset: deploy/'s own, which the files say."""
    raw = os.environ.get("TOPOALLOC_ROUND_TRIPS", "").strip()
    if raw not in ("", "1", "2"):
        raise ValueError(f"TOPOALLOC_ROUND_TRIPS={raw!r}: expected 1 or 2")
    return int(raw) if raw else None


def scheduler_config(extender_url: str, certs: Path, round_trips: int | None = None) -> dict[str, Any]:
    """The project's KubeSchedulerConfiguration (deploy/kube-scheduler), pointed at `extender_url`
    with the certificate files of `make_certs`; with `round_trips` (else TOPOALLOC_ROUND_TRIPS) its
    prioritizeVerb set to match that mode."""
    config = yaml.safe_load((REPO / "deploy" / "kube-scheduler" / "kube-scheduler-config.yaml").read_text())
    round_trips = round_trips or tier_round_trips()
    for extender in config["extenders"]:
        extender["urlPrefix"] = extender_url
        if round_trips == 1:
            extender.pop("prioritizeVerb", None)
        elif round_trips == 2:
            extender["prioritizeVerb"] = "prioritize"
        tls = extender["tlsConfig"]
        tls["caFile"] = str(certs / "ca.crt")
        tls["certFile"] = str(certs / "client.crt")
        tls["keyFile"] = str(certs / "client.key")
    config.pop("clientConnection", None)
    return config


def relay(client: socket.socket, upstream: socket.socket) -> None:
    """Bytes both ways until each side has closed, then both sockets closed."""
    upstream.settimeout(None)

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    t.start()
    pump(client, upstream)
    t.join(60)
    client.close()
    upstream.close()


class Forwarder:
    """A loopback TCP port that forwards each new connection to `target()` (a port, or None to
    refuse): what a Kubernetes Service does for the allocator's pods."""

    def __init__(self, target: Callable[[], int | None], port: int = 0) -> None:
        self.target = target
        self.sock = socket.create_server((HOST, port))
        self.port = int(self.sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=f"forwarder-{self.port}", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        port = None
        with contextlib.suppress(Exception):
            port = self.target()
        if port is None:
            client.close()
            return
        try:
            upstream = socket.create_connection((HOST, port), timeout=5)
        except OSError:
            client.close()
            return
        relay(client, upstream)

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


class AllocatorReplica:
    """One `topoalloc allocator` process with its own extender, health and webhook ports."""

    def __init__(
        self,
        kubeconfig: Path,
        certs: Path,
        workdir: Path,
        identity: str,
        *,
        lease_duration: float = 6.0,
        renew_deadline: float = 4.0,
        retry_period: float = 1.0,
        extra_args: tuple[str, ...] = (),
        round_trips: int | None = None,
    ) -> None:
        self.identity = identity
        self.port, self.health_port, self.webhook_port = free_ports(3)
        argv = topoalloc_argv(
            "allocator",
            "--kubeconfig",
            str(kubeconfig),
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--health-host",
            HOST,
            "--health-port",
            str(self.health_port),
            "--tls-cert",
            str(certs / "tls.crt"),
            "--tls-key",
            str(certs / "tls.key"),
            "--client-ca",
            str(certs / "ca.crt"),
            "--allow-client",
            f"CN={EXTENDER_CLIENT_CN}",
            "--identity",
            identity,
            "--lease-namespace",
            SYSTEM_NAMESPACE,
            "--lease-duration",
            str(lease_duration),
            "--renew-deadline",
            str(renew_deadline),
            "--retry-period",
            str(retry_period),
            "--webhook-host",
            HOST,
            "--webhook-port",
            str(self.webhook_port),
            "-vv",
            *extra_args,
        )
        round_trips = round_trips or tier_round_trips()
        if round_trips is not None:  # else the allocator's default, which deploy/ matches
            argv += ["--round-trips", str(round_trips)]
        self.process = Process(f"allocator-{identity}", argv, workdir / f"allocator-{identity}.log")

    def start(self) -> AllocatorReplica:
        self.process.start()
        return self

    def health(self, path: str = "/readyz") -> tuple[int, str]:
        http = urllib3.PoolManager(retries=False, timeout=5)
        resp = http.request("GET", f"http://{HOST}:{self.health_port}{path}")
        return resp.status, resp.data.decode(errors="replace")

    def wait_ready(self, path: str = "/syncz", timeout: float = 120.0) -> None:
        """Until `path` answers 200: /syncz (watch cache synced, leader or not: what the Deployment's
        readiness probe uses) or /readyz (synced and leading)."""
        wait_until(
            lambda: self.health(path)[0] == 200,
            timeout=timeout,
            what=f"{self.process.name} {path}",
            process=self.process,
        )


def service_account_token(
    cluster: ControlPlane, namespace: str, name: str, *, bound_pod: dict[str, Any] | None = None
) -> str:
    """A TokenRequest token for the ServiceAccount, bound to `bound_pod` when given (then it also
    carries the pod's node name, as a DaemonSet pod's projected token does)."""
    spec: dict[str, Any] = {"expirationSeconds": 3600, "audiences": []}
    if bound_pod is not None:
        meta = bound_pod["metadata"]
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    spec = {k: v for k, v in spec.items() if v != []}
    review = cluster.admin.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(review["status"]["token"])


def lease_holder(cluster: ControlPlane, name: str = "topoalloc-allocator") -> str | None:
    try:
        lease = cluster.admin.get(f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/{name}")
    except ApiStatus:
        return None
    return (lease.get("spec") or {}).get("holderIdentity") or None


def agent_argv(fixture: str, node: str, kubeconfig: Path, resync: float, *more: str) -> list[str]:
    """`topoalloc agent` replaying hw-fixtures/`fixture` as `node` under its node-bound identity
    (no hot-plug, no health port), then `more` flags."""
    return topoalloc_argv(
        "agent",
        "--fixture",
        str(FIXTURES / fixture),
        "--node-name",
        node,
        "--kubeconfig",
        str(kubeconfig),
        "--no-hotplug",
        "--health-port",
        "0",
        "--metrics-address",
        "127.0.0.1",
        "--metrics-port",
        "0",
        "--resync",
        str(resync),
        *more,
    )


class AgentProcess:
    """`topoalloc agent --fixture hw-fixtures/NAME` publishing for `node`, long-running."""

    def __init__(
        self,
        fixture: str,
        node: str,
        kubeconfig: Path,
        workdir: Path,
        *,
        resync: float = 2.0,
        more: tuple[str, ...] = (),
    ) -> None:
        self.node = node
        argv = agent_argv(fixture, node, kubeconfig, resync, "-v", *more)
        self.process = Process(f"agent-{node}", argv, workdir / f"agent-{node}.log")

    def start(self) -> AgentProcess:
        self.process.start()
        return self
