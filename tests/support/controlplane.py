"""A real Kubernetes control plane on loopback: etcd + kube-apiserver (+ kube-scheduler,
+ kube-controller-manager), for the real-cluster test tier and for benchmarks.

No pytest here, so bench/ scripts can import it. Everything runs on 127.0.0.1 on free ports with a
throw-away PKI (tests/support/pki.py); no kubelet, so Nodes are POSTed with their status. Every wait
has a deadline and reports the process log tail when it expires (tests/support/processes.py).

Binaries: etcd from Debian's etcd-server (/usr/bin/etcd), the three Kubernetes binaries of the
release asked for (tests/support/kube_releases.py: v1.35.6 or v1.36.3).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import urllib3
import yaml

from apis.timestamps import format_time
from tests.support import api_audit
from tests.support.kube_releases import DEFAULT, ETCD, KUBECTL, REPO, KubeRelease, missing_parts
from tests.support.pki import Pki
from tests.support.processes import (
    HOST,
    ControlPlaneError,
    Process,
    free_port,
    free_ports,
    wait_until,
    warnings_off,
)
from tests.support.rest import ApiStatus, Rest, kubeconfig_text

__all__ = [
    "HOST",
    "REPO",
    "ApiStatus",
    "ControlPlane",
    "ControlPlaneError",
    "KubeRelease",
    "Process",
    "Rest",
    "free_port",
    "free_ports",
    "missing_parts",
    "wait_until",
]

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


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
        release: KubeRelease = DEFAULT,
        start_timeout: float = 180.0,
        apiserver_args: tuple[str, ...] = (),
        feature_gates: Mapping[str, bool] | None = None,
        runtime_config: Mapping[str, bool] | None = None,
    ) -> None:
        self.workdir = workdir
        self.scheduler_config = dict(scheduler_config) if scheduler_config else None
        self.with_scheduler = scheduler
        self.with_controller_manager = controller_manager
        self.bin_dir = bin_dir
        self.release = release
        self.start_timeout = start_timeout
        self.apiserver_args = apiserver_args
        # Given to all three components alike, as alpha gates must be (kube_releases.NATIVE_GANG_GATES).
        self.feature_gates = dict(feature_gates or {})
        self.runtime_config = dict(runtime_config or {})
        self.processes: dict[str, Process] = {}
        # topoalloc's identities' requests recorded when the run asks (tests/support/api_audit.py)
        self.audit = bool(os.environ.get(api_audit.AUDIT_DIR_ENV))
        self.etcd_port, self.etcd_peer_port, self.api_port, self.scheduler_port, self.kcm_port = free_ports(5)
        self.url = f"https://{HOST}:{self.api_port}"
        self.audit_stem = f"{os.getpid()}-{self.api_port}-{time.monotonic_ns()}"
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
        self.bin_dir = self.bin_dir or self.release.unpack()
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

    def logs(self, lines: int = 40) -> str:
        """The last `lines` of each control-plane process's log, for a failure's message."""
        return "\n".join(p.tail(lines) for p in self.processes.values())

    def stop(self) -> None:
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.processes.get(name)
            if proc is not None:
                proc.stop()
        if self.audit:
            api_audit.record(self.workdir / "audit", self.audit_stem)
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
            *self._gate_args(),
            *([f"--runtime-config={_flag_map(self.runtime_config)}"] if self.runtime_config else []),
            *(api_audit.audit_args(self.workdir / "audit") if self.audit else ()),
            *self.apiserver_args,
        ]

    def _gate_args(self) -> list[str]:
        return [f"--feature-gates={_flag_map(self.feature_gates)}"] if self.feature_gates else []

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
                *self._gate_args(),
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
                *self._gate_args(),
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
        """`watch` of `namespace`'s pods from now on."""
        return self.watch(f"/api/v1/namespaces/{namespace}/pods", on_event, stop, name)

    def watch(
        self,
        path: str,
        on_event: Callable[[dict[str, Any]], None],
        stop: threading.Event,
        name: str,
        *,
        resource_version: str = "",
    ) -> threading.Thread:
        """Start a thread `name` that feeds every watch event of the collection at `path` after
        `resource_version` (default: read before this returns, so objects created next are seen;
        one taken from an object's write sees every later version of it, however late the thread
        starts) to `on_event` until `stop` is set (checked between chunks, and at least every 5 s),
        resuming from the last resourceVersion seen after a dropped stream."""
        rv = resource_version or self.admin.get(path, limit=1)["metadata"]["resourceVersion"]
        thread = threading.Thread(
            target=self._stream, args=(path, rv, on_event, stop), name=name, daemon=True
        )
        thread.start()
        return thread

    def _stream(
        self, path: str, rv: str, on_event: Callable[[dict[str, Any]], None], stop: threading.Event
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
                    f"{self.url}{path}?watch=1&timeoutSeconds=5&allowWatchBookmarks=true&resourceVersion={rv}"
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


def _flag_map(values: Mapping[str, bool]) -> str:
    """`A=true,B=false`, as --feature-gates and --runtime-config take them."""
    return ",".join(f"{k}={str(v).lower()}" for k, v in sorted(values.items()))


def _now() -> str:
    return format_time()
