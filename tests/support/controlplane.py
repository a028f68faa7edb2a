"""A real Kubernetes control plane on loopback: etcd + kube-apiserver (+ kube-scheduler,
+ kube-controller-manager), for the real-cluster test tier and for benchmarks.

No pytest here, so bench/ scripts can import it. Everything runs on 127.0.0.1 on free ports with a
throw-away PKI (ECDSA P-256, from `allocator.runtime.certs`); no kubelet, so Nodes are POSTed with their
status. Every wait has a deadline and reports the process log tail when it expires; processes are
started in their own session and ended by PID (SIGTERM, then SIGKILL).

Binaries: etcd from Debian's etcd-server (/usr/bin/etcd), the three Kubernetes binaries unpacked
from ../shared/k8s (`unpack DIR`) into a cache outside the repository (TOPOALLOC_K8S_BIN, default
~/.cache/topoalloc/k8s-v1.35.6), under a file lock since several test runs may share it.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import urllib3
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from allocator.runtime import certs

REPO = Path(__file__).resolve().parents[2]
K8S_DIR = REPO.parent / "shared" / "k8s"
ETCD = Path(os.environ.get("TOPOALLOC_ETCD", "/usr/bin/etcd"))
KUBECTL = Path(os.environ.get("TOPOALLOC_KUBECTL") or shutil.which("kubectl") or "/usr/bin/kubectl")
K8S_VERSION = "v1.35.6"
BIN_CACHE = Path(
    os.environ.get("TOPOALLOC_K8S_BIN", str(Path.home() / ".cache" / "topoalloc" / f"k8s-{K8S_VERSION}"))
)
HOST = "127.0.0.1"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


class ControlPlaneError(RuntimeError):
    """A component did not start, died or missed its deadline; the message carries its log tail."""


def missing_parts() -> list[str]:
    """What this machine lacks to run a control plane (empty: everything is there)."""
    out = []
    if not (K8S_DIR / "unpack").is_file():
        out.append(f"{K8S_DIR} (Kubernetes binaries and their unpack script)")
    if not os.access(ETCD, os.X_OK):
        out.append(f"{ETCD} (Debian package etcd-server)")
    if not os.access(KUBECTL, os.X_OK):
        out.append(f"{KUBECTL} (Debian package kubectl or kubernetes-client)")
    return out


def unpack_binaries(cache: Path = BIN_CACHE) -> Path:
    """kube-apiserver, kube-scheduler and kube-controller-manager in `cache` (unpacked once)."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.parent / f".{cache.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run(
            [str(K8S_DIR / "unpack"), str(cache)], capture_output=True, text=True, timeout=300
        )
    if done.returncode != 0:
        raise ControlPlaneError(f"unpacking the Kubernetes binaries failed: {done.stderr.strip()}")
    return cache


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_until(
    check: Callable[[], Any],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
    process: Process | None = None,
) -> Any:
    """Call `check` until it returns something truthy (returned) or `timeout` seconds pass.

    Exceptions from `check` count as "not yet". A `process` that exits ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            result = check()
        except Exception as exc:
            last, result = exc, None
        if result:
            return result
        if process is not None and not process.alive():
            raise ControlPlaneError(
                f"{process.name} exited ({process.returncode()}) while waiting for {what}"
            )
        if time.monotonic() > deadline:
            detail = f" (last error: {last})" if last else ""
            tail = f"\n{process.tail()}" if process else ""
            raise ControlPlaneError(f"timed out after {timeout:.0f}s waiting for {what}{detail}{tail}")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------- PKI


@dataclass
class Pki:
    """A throw-away CA and the certificates it signs (`allocator.runtime.certs`, the project's own
    PKI code), as files in `dir`."""

    dir: Path
    ca: certs.Issued = field(init=False)

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca = certs.make_ca("topoalloc-test-cluster-ca")
        self.ca_file.write_bytes(self.ca.cert_pem)

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.crt"

    def issue(
        self,
        name: str,
        common_name: str,
        *,
        organization: str | None = None,
        dns_names: tuple[str, ...] = (),
        ip_addresses: tuple[str, ...] = (),
    ) -> tuple[Path, Path]:
        """A leaf for clients (no names) or servers; returns (cert file, key file)."""
        server = bool(dns_names or ip_addresses)
        leaf = certs.issue(
            self.ca,
            common_name,
            organization=organization,
            dns_names=dns_names,
            ip_addresses=ip_addresses,
            server=server,
            client=not server,
        )
        cert_file, key_file = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        leaf.write(cert_file, key_file)
        return cert_file, key_file

    def signing_key(self, name: str) -> tuple[Path, Path]:
        """A bare key pair (service-account token signing): (public key file, private key file)."""
        key = ec.generate_private_key(ec.SECP256R1())
        pub_file, key_file = self.dir / f"{name}.pub", self.dir / f"{name}.key"
        pub_file.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        return pub_file, key_file


# ---------------------------------------------------------------------------------- processes


class Process:
    """One daemon: started in its own session, output to a log file, ended by its PID."""

    def __init__(self, name: str, argv: list[str], log: Path, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.env = dict(env) if env is not None else None
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; always reaps the process."""
        if self.popen is None:
            return
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)

    def kill(self) -> None:
        """SIGKILL now (a crash), and reap."""
        self.signal(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait(10)

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        body = "\n".join(self.text().splitlines()[-lines:])
        return f"--- {self.name} (pid {self.popen.pid if self.popen else '-'}, log {self.log}) ---\n{body}"


# --------------------------------------------------------------------------------------- REST


class ApiStatus(Exception):
    """An HTTP error answer of the API server, with its Status body."""

    def __init__(self, status: int, body: Any, method: str, path: str) -> None:
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{method} {path}: {status} {message}")

    @property
    def message(self) -> str:
        return str(self.body.get("message", "")) if isinstance(self.body, dict) else str(self.body)


class Rest:
    """A small JSON client for the API server, for test set-up and checks (the product code under
    test uses its own clients)."""

    def __init__(
        self,
        url: str,
        ca_file: Path | None = None,
        cert: tuple[Path, Path] | None = None,
        *,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """`ca_file` verifies an https `url`; without it the URL is plain http (the fake API server)."""
        self.url = url
        self.headers = dict(headers or {})
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        tls: dict[str, Any] = {}
        if ca_file is not None:
            tls = {
                "ca_certs": str(ca_file),
                "cert_file": str(cert[0]) if cert else None,
                "key_file": str(cert[1]) if cert else None,
                "cert_reqs": "CERT_REQUIRED",
            }
        self.pool = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5, read=30), **tls)

    def impersonating(
        self, user: str, *, groups: tuple[str, ...] = (), extra: Mapping[str, str] = {}
    ) -> Rest:
        """The same credentials acting as `user` (Impersonate-* headers; needs the impersonate verb)."""
        clone = object.__new__(Rest)
        clone.url, clone.pool = self.url, self.pool
        clone.headers = dict(self.headers)
        clone.headers["Impersonate-User"] = user
        # urllib3 takes one value per header name; the API server accepts groups comma-free only
        # as repeated headers, so several groups are not supported here.
        if groups:
            assert len(groups) == 1, "one impersonated group at a time"
            clone.headers["Impersonate-Group"] = groups[0]
        for key, value in extra.items():
            clone.headers[f"Impersonate-Extra-{_escape_extra(key)}"] = value
        return clone

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        url = self.url + path
        if query:
            url += "?" + urlencode(query)
        resp = self.pool.request(
            method,
            url,
            body=data,
            headers=headers,
            timeout=urllib3.Timeout(connect=5, read=timeout) if timeout else None,
        )
        try:
            parsed: Any = json.loads(resp.data) if resp.data else None
        except ValueError:
            parsed = resp.data.decode(errors="replace")
        if resp.status >= 400:
            raise ApiStatus(resp.status, parsed, method, path)
        return parsed

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query or None)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body)

    def merge_patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, **query: Any) -> Any:
        return self.request("DELETE", path, query=query or None)


def _escape_extra(key: str) -> str:
    """Impersonate-Extra-* header names percent-encode what a header name cannot hold."""
    return "".join(c if c.isalnum() or c in "-_.~!#$&'*+^`|" else f"%{ord(c):02X}" for c in key)


# ------------------------------------------------------------------------------ control plane


def kubeconfig_text(
    url: str, ca_file: Path, *, cert: tuple[Path, Path] | None = None, token: str | None = None
) -> str:
    user: dict[str, str] = {}
    if cert:
        user = {"client-certificate": str(cert[0]), "client-key": str(cert[1])}
    if token:
        user["token"] = token
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": url, "certificate-authority": str(ca_file)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
        "current-context": "local",
    }
    return yaml.safe_dump(doc, sort_keys=False)


class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler with `scheduler_config`, + kube-controller-manager).

    Use as a context manager, or call start() and stop(). `scheduler_config` is a
    KubeSchedulerConfiguration mapping; clientConnection and leader election are filled in.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        scheduler_config: Mapping[str, Any] | None = None,
        scheduler: bool = True,
        controller_manager: bool = False,
        bin_dir: Path | None = None,
        start_timeout: float = 180.0,
        apiserver_args: tuple[str, ...] = (),
    ) -> None:
        self.workdir = workdir
        self.scheduler_config = dict(scheduler_config) if scheduler_config else None
        self.with_scheduler = scheduler
        self.with_controller_manager = controller_manager
        self.bin_dir = bin_dir
        self.start_timeout = start_timeout
        self.apiserver_args = apiserver_args
        self.processes: dict[str, Process] = {}
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.api_port = free_port()
        self.scheduler_port = free_port()
        self.kcm_port = free_port()
        self.url = f"https://{HOST}:{self.api_port}"
        self.etcd_url = f"http://{HOST}:{self.etcd_port}"
        self.pki = Pki(workdir / "pki")
        self.admin_cert = self.pki.issue("admin", "topoalloc-test-admin", organization="system:masters")
        self.admin_kubeconfig = self.write_kubeconfig("admin", cert=self.admin_cert)
        self.admin = Rest(self.url, self.pki.ca_file, self.admin_cert)

    # -- files ----------------------------------------------------------------------------------

    def write_kubeconfig(
        self, name: str, *, cert: tuple[Path, Path] | None = None, token: str | None = None
    ) -> Path:
        path = self.workdir / f"{name}.kubeconfig"
        path.write_text(kubeconfig_text(self.url, self.pki.ca_file, cert=cert, token=token))
        path.chmod(0o600)
        return path

    def client_identity(self, name: str, common_name: str, organization: str | None = None) -> Path:
        """A kubeconfig for a new certificate identity (user `common_name`, group `organization`)."""
        return self.write_kubeconfig(name, cert=self.pki.issue(name, common_name, organization=organization))

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.bin_dir = self.bin_dir or unpack_binaries()
        self._start_etcd()
        self._start_apiserver()
        if self.with_controller_manager:
            self._start_controller_manager()
        else:
            # Without the service-account controller nothing creates this, and the ServiceAccount
            # admission plugin refuses pods in a namespace lacking it.
            self.ensure_default_service_account("default")
        if self.with_scheduler:
            self._start_scheduler()

    def stop(self) -> None:
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.processes.get(name)
            if proc is not None:
                proc.stop()
        data = getattr(self, "_etcd_data", None)
        if data is not None:
            shutil.rmtree(data, ignore_errors=True)

    def _spawn(self, name: str, argv: list[str]) -> Process:
        proc = Process(name, argv, self.workdir / "logs" / f"{name}.log").start()
        self.processes[name] = proc
        return proc

    def _start_etcd(self) -> None:
        # tmpfs when there is one: etcd fsyncs every write, a disk shared by parallel runs is slow.
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else self.workdir
        data = base / f"topoalloc-etcd-{os.getpid()}-{self.etcd_port}"
        self._etcd_data = data
        peer = f"http://{HOST}:{self.etcd_peer_port}"
        proc = self._spawn(
            "etcd",
            [
                str(ETCD),
                "--name=test",
                f"--data-dir={data}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=test={peer}",
                "--initial-cluster-state=new",
                "--log-level=warn",
                "--logger=zap",
            ],
        )
        http = urllib3.PoolManager(retries=False, timeout=5)
        wait_until(
            lambda: b'"health":"true"' in http.request("GET", self.etcd_url + "/health").data,
            timeout=self.start_timeout,
            what="etcd /health",
            process=proc,
        )

    def _apiserver_argv(self) -> list[str]:
        assert self.bin_dir is not None
        pki = self.pki
        cert, key = self._apiserver_cert
        sa_pub, sa_key = self._sa_keys
        return [
            str(self.bin_dir / "kube-apiserver"),
            f"--bind-address={HOST}",
            f"--advertise-address={HOST}",
            f"--secure-port={self.api_port}",
            f"--etcd-servers={self.etcd_url}",
            f"--tls-cert-file={cert}",
            f"--tls-private-key-file={key}",
            f"--client-ca-file={pki.ca_file}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            "--service-cluster-ip-range=10.96.0.0/24",
            "--authorization-mode=Node,RBAC",
            # No node-lifecycle controller lifts the not-ready taint this plugin puts on new Nodes.
            "--disable-admission-plugins=TaintNodesByCondition",
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            *self.apiserver_args,
        ]

    def _start_apiserver(self) -> None:
        if not hasattr(self, "_apiserver_cert"):
            self._apiserver_cert = self.pki.issue(
                "apiserver",
                "kube-apiserver",
                dns_names=("localhost", "kubernetes.default.svc"),
                ip_addresses=(HOST,),
            )
            self._sa_keys = self.pki.signing_key("service-account")
        proc = self._spawn("kube-apiserver", self._apiserver_argv())
        self.wait_ready(proc)

    def wait_ready(self, proc: Process | None = None) -> None:
        """Until kube-apiserver answers /readyz with ok."""
        wait_until(
            lambda: self.admin.request("GET", "/readyz", timeout=5) == "ok",
            timeout=self.start_timeout,
            what="kube-apiserver /readyz",
            process=proc or self.processes["kube-apiserver"],
        )

    def _component_kubeconfig(self, name: str, user: str) -> Path:
        return self.client_identity(name, user)

    def _wait_healthz(self, proc: Process, port: int) -> None:
        http = urllib3.PoolManager(cert_reqs="CERT_NONE", retries=False, timeout=5)
        with warnings_off():
            wait_until(
                lambda: http.request("GET", f"https://{HOST}:{port}/healthz").data == b"ok",
                timeout=self.start_timeout,
                what=f"{proc.name} /healthz",
                process=proc,
            )

    def _start_scheduler(self) -> None:
        assert self.bin_dir is not None
        kubeconfig = self._component_kubeconfig("scheduler", "system:kube-scheduler")
        config: dict[str, Any] = dict(
            self.scheduler_config
            or {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
        )
        config["clientConnection"] = {**(config.get("clientConnection") or {}), "kubeconfig": str(kubeconfig)}
        config["leaderElection"] = {"leaderElect": False}
        path = self.workdir / "scheduler-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        proc = self._spawn(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--config={path}",
                f"--bind-address={HOST}",
                f"--secure-port={self.scheduler_port}",
            ],
        )
        self._wait_healthz(proc, self.scheduler_port)

    def start_scheduler(self, config: dict[str, Any]) -> None:
        """(Re)start kube-scheduler with `config` (a KubeSchedulerConfiguration; the kubeconfig and
        leader election are filled in), e.g. to compare runs with and without an extender."""
        self.stop_scheduler()
        self.scheduler_config = config
        self._start_scheduler()

    def stop_scheduler(self) -> None:
        proc = self.processes.pop("kube-scheduler", None)
        if proc is not None:
            proc.stop()

    def _start_controller_manager(self) -> None:
        assert self.bin_dir is not None
        kubeconfig = self._component_kubeconfig("controller-manager", "system:kube-controller-manager")
        proc = self._spawn(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--bind-address={HOST}",
                f"--secure-port={self.kcm_port}",
                "--leader-elect=false",
                # No kubelet heartbeats here: the node lifecycle controller would taint every Node
                # unreachable after its grace period and evict the pods.
                "--controllers=*,-node-lifecycle-controller",
                f"--service-account-private-key-file={self._sa_keys[1]}",
                f"--root-ca-file={self.pki.ca_file}",
                "--use-service-account-credentials=true",
            ],
        )
        self._wait_healthz(proc, self.kcm_port)

    # -- operations -----------------------------------------------------------------------------

    def restart_apiserver(self, *, grace: float = 5.0, between: Callable[[], None] | None = None) -> None:
        """Stop kube-apiserver (SIGTERM; SIGKILL after `grace` seconds, as a kubelet would after the
        grace period: it stops listening at once but keeps open watches alive while it drains),
        run `between` while it is down, and start it again on the same port."""
        self.processes["kube-apiserver"].stop(timeout=grace)
        if between is not None:
            between()
        self._start_apiserver()

    def etcd_revision(self) -> int:
        http = urllib3.PoolManager(retries=False, timeout=10)
        key = base64.b64encode(b"/registry/").decode()
        resp = http.request("POST", self.etcd_url + "/v3/kv/range", body=json.dumps({"key": key}).encode())
        return int(json.loads(resp.data)["header"]["revision"])

    def compact_etcd(self) -> int:
        """Compact etcd's history up to now: watches from older resourceVersions get 410 Gone."""
        revision = self.etcd_revision()
        http = urllib3.PoolManager(retries=False, timeout=30)
        resp = http.request(
            "POST",
            self.etcd_url + "/v3/kv/compaction",
            body=json.dumps({"revision": str(revision), "physical": True}).encode(),
        )
        if resp.status != 200:
            raise ControlPlaneError(f"etcd compaction failed: {resp.status} {resp.data[:200]!r}")
        return revision

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(KUBECTL), f"--kubeconfig={kubeconfig or self.admin_kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=120,
        )
        if check and done.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}"
            )
        return done

    def ensure_default_service_account(self, namespace: str) -> None:
        with contextlib.suppress(ApiStatus):
            self.admin.post(
                f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "default"}}
            )

    def watch_pods(
        self, namespace: str, on_event: Callable[[dict[str, Any]], None], stop: threading.Event, name: str
    ) -> threading.Thread:
        """Start a thread `name` that feeds every watch event of `namespace`'s pods from now on (the
        resourceVersion is read before this returns, so pods created next are seen) to `on_event`
        until `stop` is set (checked between chunks, and at least every 5 s), resuming from the last
        resourceVersion seen after a dropped stream."""
        rv = self.admin.get(f"/api/v1/namespaces/{namespace}/pods", limit=1)["metadata"]["resourceVersion"]
        thread = threading.Thread(
            target=self._stream_pods, args=(namespace, rv, on_event, stop), name=name, daemon=True
        )
        thread.start()
        return thread

    def _stream_pods(
        self, namespace: str, rv: str, on_event: Callable[[dict[str, Any]], None], stop: threading.Event
    ) -> None:
        http = urllib3.PoolManager(
            ca_certs=str(self.pki.ca_file),
            cert_file=str(self.admin_cert[0]),
            key_file=str(self.admin_cert[1]),
            retries=False,
        )
        try:
            while not stop.is_set():
                url = (
                    f"{self.url}/api/v1/namespaces/{namespace}/pods?watch=1&timeoutSeconds=5"
                    f"&allowWatchBookmarks=true&resourceVersion={rv}"
                )
                try:
                    resp = http.request("GET", url, preload_content=False, timeout=urllib3.Timeout(read=30))
                    buffer = b""
                    for chunk in resp.stream(65536):
                        buffer += chunk
                        *lines, buffer = buffer.split(b"\n")
                        for line in lines:
                            event = json.loads(line)
                            rv = ((event.get("object") or {}).get("metadata") or {}).get(
                                "resourceVersion"
                            ) or rv
                            on_event(event)
                        if stop.is_set():
                            break
                    resp.release_conn()
                except (urllib3.exceptions.HTTPError, OSError, ValueError):
                    time.sleep(0.1)
        finally:
            http.clear()

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        self.admin.post("/api/v1/namespaces", {"metadata": {"name": name, "labels": dict(labels or {})}})
        if not self.with_controller_manager:
            self.ensure_default_service_account(name)
        else:
            wait_until(
                lambda: self.admin.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
                timeout=60,
                what=f"ServiceAccount {name}/default",
            )

    def create_node(
        self,
        name: str,
        *,
        capacity: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
    ) -> dict[str, Any]:
        """A Node as a kubelet would register it, Ready, with its status (no kubelet runs)."""
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}
        resources.update(capacity or {})
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})},
            },
            "spec": {"taints": taints} if taints else {},
            "status": {
                "capacity": resources,
                "allocatable": dict(resources),
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "no kubelet: registered by the test",
                        "lastHeartbeatTime": _now(),
                        "lastTransitionTime": _now(),
                    }
                ],
            },
        }
        return self.admin.post("/api/v1/nodes", node)

    def logs(self, lines: int = 40) -> str:
        return "\n".join(p.tail(lines) for p in self.processes.values())


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@contextlib.contextmanager
def warnings_off() -> Iterator[None]:
    """Silence urllib3's unverified-HTTPS warning for health probes of self-signed endpoints."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        yield
