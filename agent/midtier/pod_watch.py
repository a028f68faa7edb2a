"""The pods bound to this node, kept current by a list + watch with a `spec.nodeName` field selector.

For the mid-tier calculation, per pod: priority, QoS class, phase and the effective cpu/memory
request the way kube-scheduler counts it (the larger of the containers' sum and any init container,
plus pod overhead). For the device plugins, the pod objects themselves (`snapshot`), so that naming
the pod kubelet admits needs no LIST on the call path.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Any

from agent.kube import TRANSPORT_ERRORS, Kube, short_error, status_of
from apis.podgroup import spec_priority
from apis.quantity import Quantity

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodInfo:
    uid: str
    name: str
    priority: int
    qos: str  # Guaranteed | Burstable | BestEffort
    phase: str
    cpu_milli: int
    memory: int


def _quantity(value: Any, field: str) -> Quantity:
    try:
        return Quantity.parse(value, field)
    except ValueError:
        log.warning("ignoring malformed quantity %r in %s", value, field)
        return Quantity(0)


def _requests(containers: list[dict[str, Any]]) -> list[tuple[int, int]]:
    out = []
    for c in containers or []:
        req = ((c.get("resources") or {}).get("requests")) or {}
        out.append(
            (
                _quantity(req.get("cpu", 0), "cpu").milli_value(),
                _quantity(req.get("memory", 0), "memory").value(),
            )
        )
    return out


def pod_requests(pod: dict[str, Any]) -> tuple[int, int]:
    """(cpu milli-cores, memory bytes) requested, as kube-scheduler counts them: the containers'
    sum plus sidecars (restartable init containers), or an init container's peak if larger, plus
    the pod overhead."""
    spec = pod.get("spec") or {}
    main = _requests(spec.get("containers") or [])
    inits = spec.get("initContainers") or []
    sidecar = [0, 0]
    init_peak = [0, 0]
    for init, req in zip(inits, _requests(inits), strict=True):
        if init.get("restartPolicy") == "Always":
            sidecar = [sidecar[0] + req[0], sidecar[1] + req[1]]
            running = sidecar
        else:
            running = [req[0] + sidecar[0], req[1] + sidecar[1]]
        init_peak = [max(init_peak[0], running[0]), max(init_peak[1], running[1])]
    cpu = max(sum(c for c, _ in main) + sidecar[0], init_peak[0])
    mem = max(sum(m for _, m in main) + sidecar[1], init_peak[1])
    overhead = spec.get("overhead") or {}
    cpu += _quantity(overhead.get("cpu", 0), "overhead.cpu").milli_value()
    mem += _quantity(overhead.get("memory", 0), "overhead.memory").value()
    return cpu, mem


def pod_info(pod: dict[str, Any]) -> PodInfo:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    cpu, mem = pod_requests(pod)
    return PodInfo(
        uid=str(meta.get("uid", "")),
        name=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        priority=spec_priority(spec),
        qos=str(status.get("qosClass") or ""),
        phase=str(status.get("phase") or ""),
        cpu_milli=cpu,
        memory=mem,
    )


class PodWatcher(threading.Thread):
    """Keeps `pods` (uid -> PodInfo) in step with the API server; `synced` once the first list is in."""

    def __init__(self, kube: Kube, node: str, *, watch_timeout: int = 300) -> None:
        super().__init__(name="pod-watch", daemon=True)
        self.kube = kube
        self.node = node
        self.watch_timeout = watch_timeout
        self._lock = threading.Lock()
        self._pods: dict[str, PodInfo] = {}
        self._objects: dict[str, dict[str, Any]] = {}  # uid -> the pod as the API last sent it
        self._version = 0  # bumped on every change of `_objects`
        self._listed: tuple[int, list[dict[str, Any]]] = (0, [])
        self.synced = threading.Event()
        self._halt = threading.Event()
        self.error = ""
        self._open: list[Any] = []

    @property
    def started(self) -> bool:
        return self.ident is not None

    def stop(self) -> None:
        self._halt.set()
        for response in list(self._open):  # end a blocked read now, not at the watch timeout
            with contextlib.suppress(Exception):
                response.shutdown()

    def pods(self) -> list[PodInfo]:
        with self._lock:
            return list(self._pods.values())

    def snapshot(self) -> tuple[int, list[dict[str, Any]]] | None:
        """(version, this node's pod objects), the version changing with any of them; None while
        the watch is not in step with the server (not synced yet, or reconnecting after an error)."""
        with self._lock:
            if not self.synced.is_set() or self.error:
                return None
            if self._listed[0] != self._version:
                self._listed = (self._version, list(self._objects.values()))
            return self._listed

    def _relist(self) -> str:
        listing = self.kube.list_pods_on(self.node)
        pods, objects = {}, {}
        for item in listing.get("items") or []:
            info = pod_info(item)
            pods[info.uid], objects[info.uid] = info, item
        with self._lock:
            self._pods, self._objects = pods, objects
            self._version += 1
            self.error = ""
        self.synced.set()
        return str((listing.get("metadata") or {}).get("resourceVersion", ""))

    def run(self) -> None:
        backoff = 1.0
        rv = ""
        while not self._halt.is_set():
            try:
                if not rv:
                    rv = self._relist()
                self._open.clear()
                for event in self.kube.watch_pods_on(self.node, rv, self.watch_timeout, self._open):
                    if self._halt.is_set():
                        return
                    kind = event.get("type")
                    obj = event.get("object") or {}
                    if kind == "ERROR":
                        if int(obj.get("code", 0)) == 410:
                            rv = ""  # too old: list again
                        break
                    rv = str((obj.get("metadata") or {}).get("resourceVersion", rv))
                    if kind == "BOOKMARK":
                        continue
                    info = pod_info(obj)
                    with self._lock:
                        if kind == "DELETED":
                            self._pods.pop(info.uid, None)
                            self._objects.pop(info.uid, None)
                        else:
                            self._pods[info.uid], self._objects[info.uid] = info, obj
                        self._version += 1
                        self.error = ""
                backoff = 1.0
                self.error = ""
            except TRANSPORT_ERRORS as exc:
                if status_of(exc) == 410:
                    rv = ""
                self.error = short_error(exc)
                log.warning("pod watch: %s", self.error)
                self._halt.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            except ValueError as exc:  # a line that is not JSON: start over
                log.warning("pod watch: bad event (%s)", exc)
                rv = ""
