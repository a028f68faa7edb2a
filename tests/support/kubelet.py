"""A stand-in kubelet for tests: the device manager's side of the real v1beta1 gRPC over unix sockets.

- Registration server on `<dir>/kubelet.sock`: a plugin registers, the stand-in dials its endpoint,
  reads its options and keeps a ListAndWatch stream open (device lists with health and NUMA).
- `admit(pod)` does what kubelet's device manager does when it admits a pod: for each regular
  container and each resource a registered plugin serves, take the healthy devices not yet held by
  another pod, ask GetPreferredAllocation, keep the preferred IDs that are available and fill up from
  the rest in ID order, then call Allocate. A failed call fails the pod's admission (and releases
  what that pod got so far), like kubelet's UnexpectedAdmissionError.
- PodResources server (`List`, `Get`, `GetAllocatableResources`) on its own socket. Like kubelet's,
  `List` names every active pod with every regular container: a pod is added before its admission
  starts (so the pod being admitted is listed, its containers holding nothing yet), a container's
  devices appear once its Allocate has returned, and a refused pod drops out.
- A plugin whose ListAndWatch stream ends (its process died) has every device marked unhealthy, as
  kubelet's PluginDisconnected does, until it registers again: nothing is allocated through a dead
  plugin's socket, even though a gRPC channel would reconnect to a new process serving it.
- Topology Manager (`topology_policy`, `topology_scope`) with the static CPU manager (`cpu_manager`)
  as kubelet's source does them (tests/support/topology_manager.py): the NUMA affinity merged from
  device and CPU hints decides which devices are offered to GetPreferredAllocation and taken.
- `restart()`: what a kubelet restart does to plugins: the directory is emptied (plugin sockets
  deleted), a new `kubelet.sock` is created and registrations start from nothing; allocations
  survive (kubelet checkpoints them).
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2 as pb
from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from agent.deviceplugin.proto import podresources_v1_pb2 as pr
from agent.deviceplugin.proto import podresources_v1_pb2_grpc as pr_grpc
from apis.quantity import Quantity
from tests.support import topology_manager as tm


class AdmissionError(Exception):
    pass


@dataclass
class Granted:
    """One container's Allocate answer for one resource, as plain data."""

    ids: list[str]
    envs: dict[str, str]
    devices: list[tuple[str, str, str]]  # (container path, host path, permissions)
    cdi: list[str]


@dataclass
class _Plugin:
    resource: str
    endpoint: str
    channel: grpc.Channel
    stub: pb_grpc.DevicePluginStub
    preferred: bool
    devices: dict[str, tuple[str, int]] = field(default_factory=dict)  # id -> (health, numa or -1)
    lists: int = 0  # ListAndWatch messages received
    disconnected: bool = False  # its ListAndWatch stream ended
    changed: threading.Condition = field(default_factory=threading.Condition)


class StandInKubelet:
    def __init__(self, plugin_dir: Path, pod_resources_socket: Path) -> None:
        self.dir = plugin_dir
        self.pr_socket = pod_resources_socket
        self.plugins: dict[str, _Plugin] = {}
        self.registrations: list[tuple[str, str, str]] = []  # (version, endpoint, resource)
        # namespace/name -> container -> resource -> ids
        self.allocations: dict[str, dict[str, dict[str, list[str]]]] = {}
        # namespace/name -> regular container names, of the pods kubelet's pod manager holds
        self.active: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._registered = threading.Condition(self._lock)
        self._reg_server: grpc.Server | None = None
        self._pr_server: grpc.Server | None = None
        self.calls: list[tuple[str, str]] = []  # (rpc, resource)
        self.pod_resources_lists = 0  # PodResources List calls answered
        # False: Allocate without GetPreferredAllocation first, as kubelet does when its Topology
        # Manager leaves exactly the devices needed
        self.ask_preferred = True
        self.latencies: dict[str, list[float]] = {"GetPreferredAllocation": [], "Allocate": []}  # seconds
        # kubelet's Topology Manager (tests/support/topology_manager.py) and static CPU manager
        self.topology_policy = tm.NONE
        self.topology_scope = tm.CONTAINER_SCOPE
        self.cpu_manager: tm.StaticCpus | None = None  # None: the CPU manager's `none` policy
        self.numa_nodes: list[int] = []  # the machine's NUMA nodes (default: the CPUs' or devices')
        self.affinities: dict[tuple[str, str], int | None] = {}  # (pod, container) -> NUMA mask

    # -- servers ----------------------------------------------------------------------------
    def start(self) -> StandInKubelet:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._start_registration()
        self.start_pod_resources()
        return self

    def start_pod_resources(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.pr_socket.unlink()  # a new socket file, as a restarted kubelet makes
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), server)
        server.add_insecure_port(f"unix://{self.pr_socket}")
        server.start()
        self._pr_server = server

    def _start_registration(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.dir / 'kubelet.sock'}")
        server.start()
        self._reg_server = server

    def _drop_plugins(self) -> None:
        with self._lock:
            plugins, self.plugins = list(self.plugins.values()), {}
        for plugin in plugins:
            plugin.channel.close()

    def restart(self) -> None:
        """Stop, empty the plugin directory (as kubelet's device manager does on start), start again."""
        if self._reg_server is not None:
            self._reg_server.stop(0).wait()
        self._drop_plugins()
        for entry in self.dir.iterdir():
            with contextlib.suppress(OSError):
                entry.unlink()
        self._start_registration()

    def stop_pod_resources(self) -> None:
        """Stop only the PodResources server (a kubelet with the API off or its socket not mounted)."""
        if self._pr_server is not None:
            self._pr_server.stop(0).wait()
            self._pr_server = None

    def stop(self) -> None:
        for server in (self._reg_server, self._pr_server):
            if server is not None:
                server.stop(0).wait()
        self._drop_plugins()

    # -- registration -----------------------------------------------------------------------
    def _register(self, request: pb.RegisterRequest) -> None:
        channel = grpc.insecure_channel(f"unix://{self.dir / request.endpoint}")
        stub = pb_grpc.DevicePluginStub(channel)
        options = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        plugin = _Plugin(
            request.resource_name, request.endpoint, channel, stub, options.get_preferred_allocation_available
        )
        stream = stub.ListAndWatch(pb.Empty())
        threading.Thread(target=self._watch, args=(plugin, stream), daemon=True).start()
        with self._registered:
            old = self.plugins.get(request.resource_name)
            self.plugins[request.resource_name] = plugin
            self.registrations.append((request.version, request.endpoint, request.resource_name))
            self._registered.notify_all()
        if old is not None:
            old.channel.close()

    def _watch(self, plugin: _Plugin, stream: Any) -> None:
        with contextlib.suppress(grpc.RpcError, ValueError):
            for reply in stream:
                with plugin.changed:
                    plugin.devices = {
                        d.ID: (d.health, d.topology.nodes[0].ID if d.topology.nodes else -1)
                        for d in reply.devices
                    }
                    plugin.lists += 1
                    plugin.changed.notify_all()
        # the plugin went away (its process died, or a new registration replaced it): as kubelet's
        # PluginDisconnected, every device of the resource is unhealthy until a plugin registers again
        with plugin.changed:
            plugin.devices = {i: ("Unhealthy", numa) for i, (_h, numa) in plugin.devices.items()}
            plugin.disconnected = True
            plugin.changed.notify_all()

    def wait_registered(self, resources: list[str], timeout: float = 10.0, *, count: int = 1) -> None:
        """Wait until each resource has registered (`count` times in all) and sent a device list."""

        def ready() -> bool:
            done = [r for _, _, r in self.registrations]
            return all(done.count(r) >= count and r in self.plugins for r in resources)

        with self._registered:
            if not self._registered.wait_for(ready, timeout):
                raise TimeoutError(f"not registered: {resources}; got {self.registrations}")
        for r in resources:
            self.wait_devices(r, lambda devs: bool(devs), timeout)

    def wait_devices(
        self, resource: str, predicate: Any, timeout: float = 10.0
    ) -> dict[str, tuple[str, int]]:
        plugin = self.plugins[resource]
        with plugin.changed:
            if not plugin.changed.wait_for(lambda: predicate(plugin.devices), timeout):
                raise TimeoutError(
                    f"{resource}: device list never matched; last {len(plugin.devices)} devices"
                )
            return dict(plugin.devices)

    # -- admission --------------------------------------------------------------------------
    def _held(self, resource: str) -> set[str]:
        return {i for pod in self.allocations.values() for c in pod.values() for i in c.get(resource, [])}

    def admit(self, pod: dict[str, Any]) -> dict[str, dict[str, Granted]]:
        """Admit a pod: container -> resource -> what the plugin granted. Raises AdmissionError.

        With a Topology Manager policy, each container (or, with the pod scope, the pod) gets the
        NUMA affinity kubelet's policy merges from the device and CPU hints, and is refused with
        kubelet's TopologyAffinityError when the policy does not admit it; its devices and
        exclusive CPUs are then taken as kubelet's managers take them."""
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        out: dict[str, dict[str, Granted]] = {}
        containers = pod["spec"]["containers"]
        self.active[key] = [c["name"] for c in containers]  # before admission, as kubelet
        try:
            pod_affinity = self._affinity(pod, containers) if self.topology_scope == tm.POD_SCOPE else None
            for container in containers:
                affinity = (
                    pod_affinity if self.topology_scope == tm.POD_SCOPE else self._affinity(pod, [container])
                )
                self.affinities[(key, container["name"])] = affinity
                cpus = _exclusive_cpus(pod, container)
                if self.cpu_manager is not None and cpus:
                    try:
                        self.cpu_manager.allocate((key, container["name"]), cpus, affinity)
                    except ValueError as exc:
                        raise AdmissionError(str(exc)) from None
                for resource, quantity in _limits(container).items():
                    plugin = self.plugins.get(resource)
                    if plugin is None:
                        continue
                    n = Quantity.parse(quantity, resource).value()
                    granted = self._allocate(plugin, n, affinity)
                    self.allocations.setdefault(key, {}).setdefault(container["name"], {})[resource] = (
                        granted.ids
                    )
                    out.setdefault(container["name"], {})[resource] = granted
        except AdmissionError:
            self.allocations.pop(key, None)
            self.active.pop(key, None)  # rejected: Failed, no longer an active pod
            if self.cpu_manager is not None:
                self.cpu_manager.release(key)
            raise
        return out

    def _numa_nodes(self) -> list[int]:
        if self.numa_nodes:
            return list(self.numa_nodes)
        if self.cpu_manager is not None:
            return sorted(self.cpu_manager.cpus)
        return sorted({n for p in self.plugins.values() for _h, n in p.devices.values() if n >= 0})

    def _affinity(self, pod: dict[str, Any], containers: list[dict[str, Any]]) -> int | None:
        """The Topology Manager's merged affinity for these containers (one, or the pod's all)."""
        if self.topology_policy == tm.NONE:
            return None
        nodes = self._numa_nodes()
        devices: dict[str, list[tm.Hint] | None] = {}
        for resource in {r for c in containers for r in _limits(c)}:
            plugin = self.plugins.get(resource)
            if plugin is None:
                continue
            n = sum(Quantity.parse(_limits(c).get(resource, "0"), resource).value() for c in containers)
            held = self._held(resource)
            numa_of = {i: numa for i, (_h, numa) in plugin.devices.items()}
            free = [i for i, (h, _n) in plugin.devices.items() if h == "Healthy" and i not in held]
            devices[resource] = tm.device_hints(nodes, numa_of, free, n)
        cpus: dict[str, list[tm.Hint] | None] = {}
        wanted = sum(_exclusive_cpus(pod, c) for c in containers)
        if self.cpu_manager is not None and wanted:
            cpus["cpu"] = self.cpu_manager.hints(nodes, wanted)
        best, admit = tm.merge(self.topology_policy, nodes, [cpus, devices])
        if not admit:
            raise AdmissionError(
                "Resources cannot be allocated with Topology locality"
            )  # TopologyAffinityError
        return best.mask

    def _allocate(self, plugin: _Plugin, n: int, affinity: int | None = None) -> Granted:
        held = self._held(plugin.resource)
        available = sorted(i for i, (h, _) in plugin.devices.items() if h == "Healthy" and i not in held)
        if len(available) < n:
            raise AdmissionError(f"insufficient {plugin.resource}: want {n}, {len(available)} available")

        def preferred(offered: list[str]) -> list[str]:
            if not (plugin.preferred and self.ask_preferred):
                return []
            self.calls.append(("GetPreferredAllocation", plugin.resource))
            started = time.perf_counter()
            try:
                reply = plugin.stub.GetPreferredAllocation(
                    pb.PreferredAllocationRequest(
                        container_requests=[
                            pb.ContainerPreferredAllocationRequest(
                                available_deviceIDs=offered, allocation_size=n
                            )
                        ]
                    ),
                    timeout=10,
                )
            except grpc.RpcError as exc:  # kubelet fails the admission on an error here too
                raise AdmissionError(f"GetPreferredAllocation failed: {exc.details()}") from None
            self.latencies["GetPreferredAllocation"].append(time.perf_counter() - started)
            return list(reply.container_responses[0].deviceIDs)

        numa_of = {i: numa for i, (_h, numa) in plugin.devices.items()}
        try:
            chosen = tm.devices_to_allocate(n, affinity, numa_of, available, preferred)
        except ValueError as exc:
            raise AdmissionError(str(exc)) from None
        self.calls.append(("Allocate", plugin.resource))
        started = time.perf_counter()
        try:
            reply = plugin.stub.Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen)]),
                timeout=10,
            )
        except grpc.RpcError as exc:
            raise AdmissionError(f"Allocate failed due to {exc.details()}, which is unexpected") from None
        self.latencies["Allocate"].append(time.perf_counter() - started)
        c = reply.container_responses[0]
        return Granted(
            chosen,
            dict(c.envs),
            [(d.container_path, d.host_path, d.permissions) for d in c.devices],
            [d.name for d in c.cdi_devices],
        )

    def release(self, namespace: str, name: str) -> None:
        self.allocations.pop(f"{namespace}/{name}", None)
        self.active.pop(f"{namespace}/{name}", None)
        if self.cpu_manager is not None:
            self.cpu_manager.release(f"{namespace}/{name}")

    def forget(self) -> None:
        """Every pod gone (deleted, or kubelet lost its state): no pod, no device held."""
        self.allocations.clear()
        self.active.clear()
        if self.cpu_manager is not None:
            self.cpu_manager.assigned.clear()


def _limits(container: dict[str, Any]) -> dict[str, Any]:
    return dict((container.get("resources") or {}).get("limits") or {})


def _guaranteed(pod: dict[str, Any]) -> bool:
    """Kubernetes' Guaranteed QoS: every container limits cpu and memory, its requests equal."""
    spec = pod["spec"]
    for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for name in ("cpu", "memory"):
            if name not in limits:
                return False
            if name in requests and Quantity.parse(requests[name], name) != Quantity.parse(
                limits[name], name
            ):
                return False
    return True


def _exclusive_cpus(pod: dict[str, Any], container: dict[str, Any]) -> int:
    """The CPUs the static CPU manager pins for this container: an integer count in a Guaranteed pod."""
    cpu = _limits(container).get("cpu")
    if cpu is None or not _guaranteed(pod):
        return 0
    q = Quantity.parse(cpu, "cpu")
    return q.value() if q.milli_value() % 1000 == 0 else 0


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: StandInKubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        if not (self.kubelet.dir / request.endpoint).exists():
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"no socket {request.endpoint}: serve before registering"
            )
        self.kubelet._register(request)
        return pb.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: StandInKubelet) -> None:
        self.kubelet = kubelet

    def _keys(self) -> list[str]:
        # a test may seed `allocations` for a pod it never admitted
        return list(dict.fromkeys([*self.kubelet.active, *self.kubelet.allocations]))

    def _pod(self, key: str) -> pr.PodResources:
        namespace, name = key.split("/", 1)
        held = self.kubelet.allocations.get(key, {})
        names = list(dict.fromkeys([*self.kubelet.active.get(key, []), *held]))
        containers = [
            pr.ContainerResources(
                name=cname,
                devices=[
                    pr.ContainerDevices(resource_name=r, device_ids=ids)
                    for r, ids in held.get(cname, {}).items()
                ],
            )
            for cname in names
        ]
        return pr.PodResources(name=name, namespace=namespace, containers=containers)

    def List(self, request: pr.ListPodResourcesRequest, context: Any) -> pr.ListPodResourcesResponse:
        self.kubelet.pod_resources_lists += 1
        return pr.ListPodResourcesResponse(pod_resources=[self._pod(k) for k in self._keys()])

    def Get(self, request: pr.GetPodResourcesRequest, context: Any) -> pr.GetPodResourcesResponse:
        key = f"{request.pod_namespace}/{request.pod_name}"
        if key not in self._keys():
            context.abort(grpc.StatusCode.NOT_FOUND, f"pod {key} not found")
        return pr.GetPodResourcesResponse(pod_resources=self._pod(key))

    def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: Any
    ) -> pr.AllocatableResourcesResponse:
        return pr.AllocatableResourcesResponse(
            devices=[
                pr.ContainerDevices(resource_name=r, device_ids=sorted(p.devices))
                for r, p in self.kubelet.plugins.items()
            ]
        )
