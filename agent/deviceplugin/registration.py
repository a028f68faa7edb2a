"""Keep every plugin served and registered with kubelet, across kubelet restarts.

Each plugin serves before it registers. A restarting kubelet deletes the plugin sockets in its
directory and creates a new `kubelet.sock`; a watcher notices either (checked every
`check_seconds`), starts the plugin again on a fresh socket and registers it with the new kubelet.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import grpc

from agent.deviceplugin.admission import Admission
from agent.deviceplugin.plugin import DeviceList, PluginServer, register

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"


def _inode(path: Path) -> int:
    try:
        return os.stat(path).st_ino
    except OSError:
        return 0


class Registrar(threading.Thread):
    def __init__(
        self,
        directory: str | Path,
        admission: Admission,
        lists: dict[str, DeviceList],
        *,
        check_seconds: float = 1.0,
    ) -> None:
        super().__init__(name="device-plugin-registrar", daemon=True)
        self.directory = Path(directory)
        self.kubelet_socket = self.directory / KUBELET_SOCKET
        self.servers = {r: PluginServer(r, self.directory, admission, lists[r]) for r in lists}
        self.check_seconds = check_seconds
        self._registered_with: dict[str, int] = {}  # resource -> inode of the kubelet.sock it registered at
        self._halt = threading.Event()
        self.registrations = 0
        self.error = ""

    def step(self) -> None:
        """One check: restart dead plugins, register those not registered with the current kubelet."""
        kubelet = _inode(self.kubelet_socket)
        for resource, server in self.servers.items():
            if not server.alive():
                if server.inode:
                    log.warning("plugin socket %s is gone (kubelet restarted?): serving again", server.path)
                self._registered_with.pop(resource, None)
                try:
                    server.start()
                except (RuntimeError, OSError) as exc:  # grpc cannot bind: the directory is not usable
                    self.error = f"cannot serve {server.path}: {exc}"
                    log.warning("%s", self.error)
                    continue
            if kubelet and self._registered_with.get(resource) != kubelet:
                try:
                    register(self.kubelet_socket, server.path.name, resource)
                except (grpc.RpcError, grpc.FutureTimeoutError) as exc:
                    detail = exc.details() if isinstance(exc, grpc.Call) else ""
                    self.error = f"register {resource}: {detail or 'kubelet not answering'}"
                    log.warning("%s", self.error)
                    continue
                self._registered_with[resource] = kubelet
                self.registrations += 1
                self.error = ""
                log.info("registered %s with kubelet at %s", resource, self.kubelet_socket)

    def registered(self) -> set[str]:
        return set(self._registered_with)

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                self.step()
            except OSError as exc:  # the directory itself is unusable: say so, keep trying
                self.error = f"device plugin directory {self.directory}: {exc}"
                log.warning("%s", self.error)
            except Exception:  # never let the registrar die: kubelet would lose the plugins for good
                log.exception("device plugin registration step failed")
            self._halt.wait(self.check_seconds)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(10.0)  # a registration in flight gives up after its 5 s timeout
        for server in self.servers.values():
            server.stop()
