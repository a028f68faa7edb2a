"""The agent's health endpoint for the DaemonSet probes.

/healthz  200 while the main loop has completed a pass recently (3 resync intervals), else 503
/readyz   200 once a pass has discovered the node and (with a cluster) published it, else 503
/status   JSON: last pass time, duration, errors, device counts, device plugin state
/metrics  Prometheus text: the node's devices by health, claim prepares, device plugin refusals
          and PodResources mismatches

The same server class also runs as the metrics listener (`metrics:` in the agent config), which
answers /metrics alone: /status names pods and devices, and stays on the loopback health listener.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)


ALL_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/status"})
METRICS_ONLY = frozenset({"/metrics"})


class HealthServer:
    def __init__(
        self,
        address: str,
        port: int,
        state: Callable[[], dict[str, Any]],
        *,
        paths: frozenset[str] = ALL_PATHS,
        name: str = "healthz",
    ) -> None:
        self.state = state
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                info = outer.state() if self.path in paths - METRICS_ONLY else {}
                if self.path not in paths:
                    code, body, ctype = 404, b"not found\n", "text/plain"
                elif self.path == "/healthz":
                    code = 200 if info.get("live") else 503
                    body = b"ok\n" if code == 200 else b"main loop stalled\n"
                    ctype = "text/plain"
                elif self.path == "/readyz":
                    code = 200 if info.get("ready") else 503
                    body = (
                        b"ready\n"
                        if code == 200
                        else (info.get("notReadyReason", "not ready") + "\n").encode()
                    )
                    ctype = "text/plain"
                elif self.path == "/metrics":  # the agent's metrics (the process's default registry)
                    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

                    code, body, ctype = 200, generate_latest(), CONTENT_TYPE_LATEST
                elif self.path == "/status":
                    code, body, ctype = 200, json.dumps(info, default=str).encode(), "application/json"
                else:
                    code, body, ctype = 404, b"not found\n", "text/plain"
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: keep quiet
                log.debug("health: " + format, *args)

        self.server = ThreadingHTTPServer((address, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
