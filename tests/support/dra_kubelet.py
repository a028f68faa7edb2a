"""A stand-in kubelet for DRA drivers: the plugin manager's and the DRA manager's side of the real
gRPC over unix sockets (beside tests/support/kubelet.py, the device plugin stand-in).

Registration, as kubelet's plugin watcher and operation executor do it: a socket appearing in the
registry folder is dialled (10 s), asked `GetInfo`; a plugin of type `DRAPlugin` is validated (the
first of its supported versions that this kubelet knows, `v1.DRAPlugin` then `v1beta1.DRAPlugin`;
none known is a refusal), registered under its driver name with its endpoint, and told the outcome
with `NotifyRegistrationStatus` (5 s). A socket that disappears deregisters its plugin.

`prepare(pod)` is the DRA manager's PrepareResources: each of the pod's claims by name
(`spec.resourceClaims`, a template's claim through `status.resourceClaimStatuses`, which must then
be owned by the pod), read from the API, reserved for the pod (`status.reservedFor`), grouped by the
drivers of its allocation results (each must be registered), prepared once per claim with one
`NodePrepareResources` call per driver (45 s), every claim answered; a per-claim error fails the
pod. It returns each container's CDI device IDs, as GetResources hands them to the runtime.
`unprepare(pod)` calls `NodeUnprepareResources` for the claims no other pod still uses.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from agent.dra.proto import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from agent.dra.proto import pluginregistration_v1_pb2 as reg
from agent.dra.proto import pluginregistration_v1_pb2_grpc as reg_grpc

# What this kubelet speaks, most recent first (kubelet 1.34+).
SERVICES: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
DIAL_TIMEOUT = 10.0
NOTIFY_TIMEOUT = 5.0
CALL_TIMEOUT = 45.0
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"


class PrepareError(Exception):
    """PrepareResources or UnprepareResources failed for the pod (kubelet retries it later)."""


@dataclass
class DraPlugin:
    driver: str
    endpoint: str
    service: str  # the chosen supported version
    channel: grpc.Channel
    stub: Any
    pb: ModuleType
    socket: Path


@dataclass
class PreparedDevice:
    request_names: list[str]
    pool: str
    device: str
    cdi_ids: list[str]


@dataclass
class ClaimInfo:
    """kubelet's claim info cache entry."""

    uid: str
    namespace: str
    name: str
    drivers: list[str]
    pods: set[str] = field(default_factory=set)
    devices: dict[str, list[PreparedDevice]] = field(default_factory=dict)  # driver -> devices
    prepared: bool = False

    def cdi_ids(self, request: str) -> list[str]:
        """cdiDevicesAsList: a container's request gets the devices serving it (all for "")."""
        return [
            i
            for devices in self.devices.values()
            for d in devices
            if not request or not d.request_names or request in d.request_names
            for i in d.cdi_ids
        ]


class DraKubelet:
    def __init__(self, registry_dir: Path, get: Callable[[str], Any], *, poll_seconds: float = 0.05) -> None:
        self.registry_dir = registry_dir
        self.get = get  # GET a path of the API server (raises on an error status)
        self.poll_seconds = poll_seconds
        self.plugins: dict[str, DraPlugin] = {}
        # registration socket -> (inode, ctime) of the file handled: kubelet watches with inotify, a
        # poll must tell a socket made again at the same path (often with the same inode) this way
        self.sockets: dict[Path, tuple[int, int]] = {}
        self.registrations: list[
            tuple[str, str, tuple[str, ...], str]
        ] = []  # driver, endpoint, offered, chosen
        self.refusals: list[str] = []  # why a plugin was not registered
        self.cache: dict[tuple[str, str], ClaimInfo] = {}  # (namespace, name) -> claim info
        self.calls: list[tuple[str, str, list[str]]] = []  # (rpc, driver, claim UIDs)
        self._lock = threading.Condition()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the plugin watcher ----------------------------------------------------------------------
    def start(self) -> DraKubelet:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._watch, name="dra-kubelet-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(15)
        with self._lock:
            for plugin in self.plugins.values():
                plugin.channel.close()
            self.plugins.clear()

    def _watch(self) -> None:
        while not self._halt.is_set():
            present = {}
            for path in sorted(self.registry_dir.glob("*.sock")):
                with contextlib.suppress(OSError):
                    st = path.stat()
                    present[path] = (st.st_ino, st.st_ctime_ns)
            for path in [p for p in self.sockets if present.get(p) != self.sockets[p]]:
                self._deregister(path)
            for path, identity in present.items():
                if self.sockets.get(path) != identity:
                    self.sockets[path] = identity
                    self._register(path)
            self._halt.wait(self.poll_seconds)

    def _deregister(self, socket: Path) -> None:
        del self.sockets[socket]
        with self._lock:
            for driver in [d for d, p in self.plugins.items() if p.socket == socket]:
                self.plugins.pop(driver).channel.close()

    def _register(self, socket: Path) -> None:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=DIAL_TIMEOUT)
                stub = reg_grpc.RegistrationStub(channel)
                info = stub.GetInfo(reg.InfoRequest(), timeout=DIAL_TIMEOUT)
            except (grpc.RpcError, grpc.FutureTimeoutError) as exc:
                self.refusals.append(f"{socket}: cannot get plugin info: {exc}")
                return
            error = self._validate_and_add(info, socket)
            with contextlib.suppress(grpc.RpcError):
                stub.NotifyRegistrationStatus(
                    reg.RegistrationStatus(plugin_registered=not error, error=error), timeout=NOTIFY_TIMEOUT
                )

    def _validate_and_add(self, info: reg.PluginInfo, socket: Path) -> str:
        if info.type != "DRAPlugin":
            return self._refuse(f"no handler registered for plugin type: {info.type}")
        offered = tuple(info.supported_versions)
        if not offered:
            return self._refuse("empty list of supported gRPC services (aka supported versions)")
        chosen = next((s for s in offered if s in SERVICES), None)
        if chosen is None:
            return self._refuse(
                f"none of services supported by the plugin ({list(offered)}) are supported by the kubelet "
                f"({list(SERVICES)})"
            )
        pb, pb_grpc = SERVICES[chosen]
        channel = grpc.insecure_channel(f"unix://{info.endpoint}")
        plugin = DraPlugin(
            info.name, info.endpoint, chosen, channel, pb_grpc.DRAPluginStub(channel), pb, socket
        )
        with self._lock:
            old = self.plugins.get(info.name)
            self.plugins[info.name] = plugin
            self.registrations.append((info.name, info.endpoint, offered, chosen))
            self._lock.notify_all()
        if old is not None:
            old.channel.close()
        return ""

    def _refuse(self, why: str) -> str:
        with self._lock:
            self.refusals.append(why)
            self._lock.notify_all()
        return why

    def wait_registered(self, driver: str, timeout: float = 10.0, *, count: int = 1) -> DraPlugin:
        def ready() -> bool:
            return sum(1 for r in self.registrations if r[0] == driver) >= count and driver in self.plugins

        with self._lock:
            if not self._lock.wait_for(ready, timeout):
                raise TimeoutError(
                    f"{driver} not registered; got {self.registrations}, refused {self.refusals}"
                )
            return self.plugins[driver]

    # -- the DRA manager -------------------------------------------------------------------------
    def _claim_names(self, pod: dict[str, Any]) -> list[tuple[str, bool]]:
        """resourceclaim.Name for each pod claim: (claim name, must check the pod owns it)."""
        statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        out = []
        for pod_claim in pod["spec"].get("resourceClaims") or []:
            if pod_claim.get("resourceClaimName"):
                out.append((pod_claim["resourceClaimName"], False))
            elif pod_claim.get("resourceClaimTemplateName"):
                status = statuses.get(pod_claim["name"])
                if status is None:
                    raise PrepareError(f"pod {_key(pod)}: resource claim not found for {pod_claim['name']}")
                if status.get("resourceClaimName"):
                    out.append((status["resourceClaimName"], True))
            else:
                raise PrepareError(
                    f"pod {_key(pod)}: claim {pod_claim.get('name')} names no claim or template"
                )
        return out

    def prepare(self, pod: dict[str, Any]) -> dict[str, list[str]]:
        """Prepare the pod's claims; container name -> its CDI device IDs. Raises PrepareError."""
        ns, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
        checked: list[tuple[dict[str, Any], list[str]]] = []
        for name, must_own in self._claim_names(pod):
            try:
                claim = self.get(CLAIMS.format(ns=ns, name=name))
            except Exception as exc:  # the API's error, as kubelet wraps it
                raise PrepareError(f"fetch ResourceClaim {name}: {exc}") from None
            owners = (claim["metadata"].get("ownerReferences")) or []
            if must_own and not any(o.get("uid") == uid and o.get("controller") for o in owners):
                raise PrepareError(f"ResourceClaim {name} was not created for pod {_key(pod)}")
            reserved = (claim.get("status") or {}).get("reservedFor") or []
            if not any(r.get("resource") == "pods" and r.get("uid") == uid for r in reserved):
                raise PrepareError(
                    f"pod {pod['metadata']['name']} ({uid}) is not allowed to use ResourceClaim {name} "
                    f"({claim['metadata']['uid']})"
                )
            results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                "results"
            )
            drivers = list(dict.fromkeys(r["driver"] for r in results or []))
            for driver in drivers:
                if driver not in self.plugins:
                    raise PrepareError(f"DRA driver {driver} is not registered")
            checked.append((claim, drivers))
        batches: dict[str, list[ClaimInfo]] = {}
        for claim, drivers in checked:
            key = (ns, claim["metadata"]["name"])
            info = self.cache.get(key)
            if info is None:
                info = self.cache[key] = ClaimInfo(claim["metadata"]["uid"], ns, key[1], drivers)
            elif info.uid != claim["metadata"]["uid"]:
                raise PrepareError(
                    f"old ResourceClaim with same name {key[1]} and different UID {info.uid} still exists"
                )
            info.pods.add(uid)
            if not info.prepared:
                for driver in drivers:
                    batches.setdefault(driver, []).append(info)
        for driver, infos in batches.items():
            plugin = self.plugins[driver]
            answer = self._call(plugin, "NodePrepareResources", infos)
            for claim_uid, result in answer.claims.items():
                info = next(i for i in infos if i.uid == claim_uid)
                if result.error:
                    raise PrepareError(
                        f"NodePrepareResources failed for ResourceClaim {info.name}: {result.error}"
                    )
                info.devices[driver] = [
                    PreparedDevice(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
                    for d in result.devices
                ]
            if len(answer.claims) != len(infos):
                raise PrepareError(
                    f"NodePrepareResources skipped {len(infos) - len(answer.claims)} ResourceClaims"
                )
        for infos in batches.values():
            for info in infos:
                info.prepared = True
        return self._container_cdi(pod)

    def _container_cdi(self, pod: dict[str, Any]) -> dict[str, list[str]]:
        """GetResources: each container's CDI IDs, from the claims (and requests) it names."""
        statuses = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        names = {
            pc["name"]: pc.get("resourceClaimName") or statuses.get(pc["name"])
            for pc in pod["spec"].get("resourceClaims") or []
        }
        out: dict[str, list[str]] = {}
        for container in pod["spec"]["containers"]:
            ids: list[str] = []
            for ref in (container.get("resources") or {}).get("claims") or []:
                claim = names.get(ref["name"])
                info = self.cache.get((pod["metadata"]["namespace"], claim)) if claim else None
                if info is not None:
                    ids += info.cdi_ids(ref.get("request", ""))
            out[container["name"]] = ids
        return out

    def unprepare(self, pod: dict[str, Any]) -> None:
        """UnprepareResources: the claims only this pod used are unprepared. Raises PrepareError."""
        uid = pod["metadata"]["uid"]
        batches: dict[str, list[ClaimInfo]] = {}
        for info in [i for i in self.cache.values() if uid in i.pods]:
            if len(info.pods) > 1:
                info.pods.discard(uid)
                continue
            for driver in info.drivers:
                batches.setdefault(driver, []).append(info)
        for driver, infos in batches.items():
            plugin = self.plugins.get(driver)
            if plugin is None:
                raise PrepareError(f"DRA driver {driver} is not registered")
            answer = self._call(plugin, "NodeUnprepareResources", infos)
            for claim_uid, result in answer.claims.items():
                if result.error:
                    name = next(i.name for i in infos if i.uid == claim_uid)
                    raise PrepareError(
                        f"NodeUnprepareResources failed for ResourceClaim {name}: {result.error}"
                    )
            if len(answer.claims) != len(infos):
                raise PrepareError(
                    f"NodeUnprepareResources skipped {len(infos) - len(answer.claims)} ResourceClaims"
                )
        for infos in batches.values():
            for info in infos:
                self.cache.pop((info.namespace, info.name), None)

    def _call(self, plugin: DraPlugin, rpc: str, infos: list[ClaimInfo]) -> Any:
        pb = plugin.pb
        claims = [pb.Claim(namespace=i.namespace, uid=i.uid, name=i.name) for i in infos]
        request = getattr(pb, f"{rpc}Request")(claims=claims)
        self.calls.append((rpc, plugin.driver, [i.uid for i in infos]))
        try:
            return getattr(plugin.stub, rpc)(request, timeout=CALL_TIMEOUT)
        except grpc.RpcError as exc:
            raise PrepareError(f"{rpc}: {exc.code().name}: {exc.details()}") from None


def _key(pod: dict[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
