"""A gRPC server on a unix socket that kubelet dials: the device plugins and the DRA plugin serve
this way.

The socket file is created fresh on start (a stale one from an earlier process is removed first)
and remembered by inode, so `alive` tells when someone deleted or replaced it (a restarting kubelet
empties its device-plugins directory) and `stop` never removes a socket that is no longer ours.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc


class UnixGrpcServer:
    def __init__(
        self,
        path: Path,
        add_servicers: Callable[[grpc.Server], None],
        *,
        workers: int = 8,
        name: str = "grpc",
    ) -> None:
        self.path = path
        self.add_servicers = add_servicers
        self.workers = workers
        self.name = name
        self._server: grpc.Server | None = None
        self.inode = 0

    def start(self) -> None:
        """Serve on a fresh socket file; raises RuntimeError or OSError when it cannot bind."""
        self.stop()
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=self.name)
        )
        self.add_servicers(server)
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self._server = server
        self.inode = os.stat(self.path).st_ino

    def alive(self) -> bool:
        """Serving, and our socket file is still the one at `path`."""
        try:
            return self._server is not None and os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait(2.0)
            self._server = None
            try:
                if os.stat(self.path).st_ino == self.inode:
                    self.path.unlink()
            except OSError:
                pass
