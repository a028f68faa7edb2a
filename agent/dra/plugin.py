"""The kubelet DRA plugin's gRPC side: the `DRAPlugin` service (dra/v1 and dra/v1beta1, the same
messages) on the DRA socket and the `Registration` service (pluginregistration/v1) on the
registration socket in kubelet's plugins_registry folder.

kubelet's plugin watcher finds the registration socket, calls GetInfo (type `DRAPlugin`, name the
driver, endpoint the DRA socket, supported versions `v1.DRAPlugin` and `v1beta1.DRAPlugin`: kubelet
takes the first it knows), registers the plugin and calls NotifyRegistrationStatus. The DRA socket
is served before the registration socket appears, so kubelet never dials an endpoint that is not
there; a keeper thread serves either again when its socket file is deleted (DRA socket first).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from agent import host_paths
from agent.dra.claims import ClaimRef
from agent.dra.preparer import Preparer
from agent.dra.proto import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from agent.dra.proto import pluginregistration_v1_pb2 as reg
from agent.dra.proto import pluginregistration_v1_pb2_grpc as reg_grpc
from agent.unix_grpc import UnixGrpcServer
from apis import dra

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"  # pluginregistration/v1 constants.go
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # kubelet takes the first it knows
DEFAULT_REGISTRY_DIR = host_paths.DRA_REGISTRY
DEFAULT_PLUGIN_DIR = host_paths.DRA_PLUGIN
DRA_SOCKET = "dra.sock"


def registration_socket_name() -> str:
    """`topoalloc.io-reg.sock`, the name kubelet's Go helper gives a driver's registration socket."""
    return f"{dra.DRIVER}-reg.sock"


def _servicer(pb: ModuleType, pb_grpc: ModuleType, preparer: Preparer) -> Any:
    """A DRAPlugin servicer for one version of the API (v1 and v1beta1 share every message)."""

    shares = "share_id" in pb.Device.DESCRIPTOR.fields_by_name  # v1 has it, v1beta1 does not

    def refs(request: Any) -> list[ClaimRef]:
        return [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]

    class Servicer(pb_grpc.DRAPluginServicer):
        def NodePrepareResources(self, request: Any, context: Any) -> Any:
            answers = preparer.prepare(refs(request))
            return pb.NodePrepareResourcesResponse(
                claims={
                    uid: pb.NodePrepareResourceResponse(
                        devices=[
                            pb.Device(
                                request_names=list(d.requests),
                                pool_name=d.pool,
                                device_name=d.device,
                                cdi_device_ids=list(d.cdi_ids),
                                **({"share_id": d.share_id} if d.share_id and shares else {}),
                            )
                            for d in answer.devices
                        ],
                        error=answer.error,
                    )
                    for uid, answer in answers.items()
                }
            )

        def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
            errors = preparer.unprepare(refs(request))
            return pb.NodeUnprepareResourcesResponse(
                claims={uid: pb.NodeUnprepareResourceResponse(error=e) for uid, e in errors.items()}
            )

    return Servicer()


class RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: Path, on_registered: Callable[[], None]) -> None:
        self.endpoint = endpoint
        self.on_registered = on_registered
        self.registered = False
        self.error = ""
        self.notifications = 0

    def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=dra.DRIVER,
            endpoint=str(self.endpoint),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        self.notifications += 1
        self.registered = request.plugin_registered
        self.error = "" if request.plugin_registered else request.error or "kubelet refused the plugin"
        if request.plugin_registered:
            log.info("registered with kubelet as DRA driver %s", dra.DRIVER)
            self.on_registered()
        else:
            log.warning("kubelet did not register the DRA plugin: %s", self.error)
        return reg.RegistrationStatusResponse()


class DraServers(threading.Thread):
    """Serves the DRA socket, then the registration socket, and keeps both served."""

    def __init__(
        self,
        preparer: Preparer,
        *,
        registry_dir: str | Path,
        plugin_dir: str | Path,
        on_registered: Callable[[], None] = lambda: None,
        check_seconds: float = 1.0,
    ) -> None:
        super().__init__(name="dra-plugin", daemon=True)
        self.plugin_dir = Path(plugin_dir)
        self.registry_dir = Path(registry_dir)
        v1 = _servicer(dra_v1_pb2, dra_v1_pb2_grpc, preparer)
        v1beta1 = _servicer(dra_v1beta1_pb2, dra_v1beta1_pb2_grpc, preparer)

        def add_dra(server: grpc.Server) -> None:
            dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(v1, server)
            dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(v1beta1, server)

        self.dra = UnixGrpcServer(self.plugin_dir / DRA_SOCKET, add_dra, workers=4, name="dra")
        self.registration = RegistrationServicer(self.dra.path, on_registered)
        self.reg = UnixGrpcServer(
            self.registry_dir / registration_socket_name(),
            lambda server: reg_grpc.add_RegistrationServicer_to_server(self.registration, server),
            workers=2,
            name="dra-reg",
        )
        self.check_seconds = check_seconds
        self._halt = threading.Event()
        self.error = ""
        self.serves = 0  # times a socket was (re)served

    def step(self) -> None:
        """Serve whichever socket is not served (the DRA socket first)."""
        for server, folder in ((self.dra, self.plugin_dir), (self.reg, self.registry_dir)):
            if server.alive():
                continue
            if server.inode:
                log.warning("DRA plugin socket %s is gone: serving it again", server.path)
            try:
                folder.mkdir(parents=True, exist_ok=True)
                server.start()
            except (RuntimeError, OSError) as exc:  # grpc cannot bind: the folder is not usable
                self.error = f"cannot serve {server.path}: {exc}"
                log.warning("%s", self.error)
                return  # never offer registration without the DRA socket behind it
            self.serves += 1
            self.error = ""

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.step()
            except Exception:  # never let the keeper die: kubelet would lose the plugin for good
                log.exception("DRA plugin keeper step failed")
            self._halt.wait(self.check_seconds)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(5.0)
        self.reg.stop()  # kubelet sees the plugin go before its endpoint does
        self.dra.stop()
