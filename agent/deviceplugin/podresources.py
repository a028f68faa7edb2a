"""kubelet's PodResources API (v1 `List`) as plain data, over one long-lived unix-socket channel.

Admission asks it on every GetPreferredAllocation and Allocate (which pod is being admitted, see
identity.py) and the cross-check after admission (crosscheck.py). kubelet rate-limits this API
(100 calls/s, bursts of 10, since 1.27); a RESOURCE_EXHAUSTED answer is retried for a moment.
"""

from __future__ import annotations

import threading
import time

import grpc

from agent import host_paths
from agent.deviceplugin.proto import podresources_v1_pb2 as pr
from agent.deviceplugin.proto import podresources_v1_pb2_grpc as pr_grpc

DEFAULT_POD_RESOURCES_SOCKET = host_paths.POD_RESOURCES_SOCKET

# namespace/name -> container -> resource -> kubelet device IDs. Every container kubelet lists is
# there, an empty map when it holds no device yet.
KubeletPods = dict[str, dict[str, dict[str, list[str]]]]


class PodResourcesError(Exception):
    """kubelet's PodResources API did not answer; the message names the socket and the status."""


def to_kubelet_pods(reply: pr.ListPodResourcesResponse) -> KubeletPods:
    out: KubeletPods = {}
    for pod in reply.pod_resources:
        containers = out.setdefault(f"{pod.namespace}/{pod.name}", {})
        for c in pod.containers:
            held = containers.setdefault(c.name, {})
            for dev in c.devices:
                held.setdefault(dev.resource_name, []).extend(dev.device_ids)
    return out


class PodResourcesClient:
    def __init__(self, socket: str, *, timeout: float = 2.0, busy_retry_seconds: float = 1.0) -> None:
        self.socket = socket
        self.timeout = timeout
        self.busy_retry_seconds = busy_retry_seconds
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: pr_grpc.PodResourcesListerStub | None = None

    def _lister(self) -> pr_grpc.PodResourcesListerStub:
        with self._lock:
            if self._stub is None:
                self._channel = grpc.insecure_channel(f"unix://{self.socket}")
                self._stub = pr_grpc.PodResourcesListerStub(self._channel)
            return self._stub

    def _reset(self) -> None:
        """Drop the channel: kubelet may have restarted on a new socket file."""
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._stub = None

    def list(self) -> KubeletPods:
        """Every active pod kubelet knows, with each container's devices. Raises PodResourcesError."""
        deadline = time.monotonic() + self.busy_retry_seconds
        while True:
            try:
                reply = self._lister().List(pr.ListPodResourcesRequest(), timeout=self.timeout)
                return to_kubelet_pods(reply)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                self._reset()
                details = exc.details() if hasattr(exc, "details") else str(exc)
                raise PodResourcesError(f"PodResources {self.socket}: {code.name} {details}") from None

    def close(self) -> None:
        self._reset()
