"""One kubelet device plugin (v1beta1 `DevicePlugin` service) per resource, on its own unix socket.

ListAndWatch sends the device list at once and again whenever it changes (health included), until
kubelet hangs up or the server stops. GetPreferredAllocation and Allocate defer to `Admission`; a
refused Allocate is answered FAILED_PRECONDITION with the reason, which kubelet puts in the pod's
admission error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from agent.deviceplugin.admission import Admission, Refused
from agent.deviceplugin.grants import Grant
from agent.deviceplugin.inventory import PluginDevice
from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2 as pb
from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from agent.unix_grpc import UnixGrpcServer

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
STREAM_POLL_SECONDS = 1.0  # how often a parked ListAndWatch checks that kubelet is still there


class DeviceList:
    """The current device list of one resource, with a version bumped on every change."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._devices: tuple[PluginDevice, ...] = ()
        self.version = 0
        self.closed = False

    def publish(self, devices: list[PluginDevice]) -> bool:
        with self._cond:
            if tuple(devices) == self._devices:
                return False
            self._devices = tuple(devices)
            self.version += 1
            self._cond.notify_all()
            return True

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def wait_newer(self, seen: int, timeout: float) -> tuple[int, tuple[PluginDevice, ...] | None]:
        with self._cond:
            self._cond.wait_for(lambda: self.version != seen or self.closed, timeout)
            if self.version != seen:
                return self.version, self._devices
            return seen, None


def to_proto_devices(devices: tuple[PluginDevice, ...] | list[PluginDevice]) -> pb.ListAndWatchResponse:
    out = []
    for dev in devices:
        msg = pb.Device(ID=dev.id, health=HEALTHY if dev.healthy else UNHEALTHY)
        if dev.numa >= 0:
            msg.topology.nodes.append(pb.NUMANode(ID=dev.numa))
        out.append(msg)
    return pb.ListAndWatchResponse(devices=out)


def to_proto_grant(grant: Grant) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=grant.envs,
        devices=[
            pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in grant.devices
        ],
        cdi_devices=[pb.CDIDevice(name=n) for n in grant.cdi_devices],
    )


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    def __init__(self, resource: str, admission: Admission, devices: DeviceList) -> None:
        self.resource = resource
        self.admission = admission
        self.devices = devices

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        seen = -1
        while context.is_active() and not self.devices.closed:
            seen, devices = self.devices.wait_newer(seen, STREAM_POLL_SECONDS)
            if devices is not None:
                yield to_proto_devices(devices)

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        out = []
        for req in request.container_requests:
            ids = self.admission.preferred(
                self.resource,
                list(req.available_deviceIDs),
                list(req.must_include_deviceIDs),
                req.allocation_size,
            )
            out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=out)

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        out = []
        for req in request.container_requests:
            try:
                grant = self.admission.allocate(self.resource, list(req.devices_ids))
            except Refused as exc:
                log.warning("Allocate %s %s refused: %s", self.resource, list(req.devices_ids), exc)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"topoalloc: {exc}")
                raise AssertionError("unreachable") from None  # abort() raises
            out.append(to_proto_grant(grant))
        return pb.AllocateResponse(container_responses=out)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def socket_name(resource: str) -> str:
    """`nvidia.com/gpu` -> `topoalloc-nvidia.com-gpu.sock`."""
    return "topoalloc-" + resource.replace("/", "-") + ".sock"


class PluginServer(UnixGrpcServer):
    """The gRPC server of one resource's plugin on `<dir>/<socket_name>`."""

    def __init__(self, resource: str, directory: Path, admission: Admission, devices: DeviceList) -> None:
        self.resource = resource
        self.servicer = DevicePluginServicer(resource, admission, devices)
        super().__init__(
            directory / socket_name(resource),
            lambda server: pb_grpc.add_DevicePluginServicer_to_server(self.servicer, server),
            name="dp",
        )


def register(kubelet_socket: Path, endpoint: str, resource: str, timeout: float = 5.0) -> None:
    """Register one plugin with kubelet; raises grpc.RpcError / grpc.FutureTimeoutError."""
    with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        pb_grpc.RegistrationStub(channel).Register(
            pb.RegisterRequest(
                version=API_VERSION,
                endpoint=endpoint,
                resource_name=resource,
                options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
            ),
            timeout=timeout,
        )
