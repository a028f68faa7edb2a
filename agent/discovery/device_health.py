"""Device health: NVML Xid/ECC events, per-GPU NVML errors, RDMA port state, vanished devices.

A `HealthBook` keeps, per device, the current verdict and when it last changed (the condition's
lastTransitionTime), so a Device is only rewritten when a verdict really changes. GPUs come back:
an NVML error clears on the next clean answer; a critical Xid clears once the GPU has answered
normally for `xid_hold_seconds` with no further critical event (the driver sends no "recovered"
event, and an Xid such as 79 means the GPU needs a reset first, which shows up as NVML errors).

`EventWatcher` runs NVML's blocking event wait in its own thread, the way the NVIDIA device plugin
does: a timeout is normal, application Xids (13, 31, 43, 45, 68, 109 by default) are ignored.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from agent.discovery.gpu_facts import describe

log = logging.getLogger(__name__)

READY = "Ready"
XID = "XidCriticalError"
DBE = "DoubleBitEccError"
NVML_ERROR = "NVMLError"
NVML_UNAVAILABLE = "NVMLUnavailable"
MISSING = "Missing"
PORT_DOWN = "PortDown"
TOPOLOGY_INCOMPLETE = "TopologyIncomplete"


@dataclass
class Verdict:
    healthy: bool
    reason: str
    message: str = ""
    since: float = 0.0  # when `healthy` last changed
    last_xid: int | None = None


@dataclass
class _XidMark:
    xid: int
    at: float
    reason: str


class HealthBook:
    """Verdicts keyed by ("gpu", uuid) or ("rdma", pf address)."""

    def __init__(self, *, xid_hold_seconds: float, clock: Callable[[], float] = time.time) -> None:
        self.xid_hold = xid_hold_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._verdicts: dict[tuple[str, str], Verdict] = {}
        self._xids: dict[str, _XidMark] = {}  # uuid -> last critical event
        self._last_xid: dict[str, int] = {}
        self.changed = threading.Event()  # set when an event changes a verdict

    def record_event(self, uuid: str, xid: int, reason: str = XID) -> None:
        with self._lock:
            self._xids[uuid] = _XidMark(xid, self.clock(), reason)
            self._last_xid[uuid] = xid
        self.changed.set()

    def xid_mark(self, uuid: str) -> tuple[str, str, int] | None:
        """(reason, message, xid) while a critical event holds the GPU unhealthy."""
        with self._lock:
            mark = self._xids.get(uuid)
            if mark is None:
                return None
            if self.clock() - mark.at >= self.xid_hold:
                del self._xids[uuid]
                return None
            label = "Xid" if mark.reason == XID else "event"
            return mark.reason, f"{label} {mark.xid} reported by NVML", mark.xid

    def export_xids(self) -> dict[str, Any]:
        """The Xid history for a checkpoint (times are the book's clock, wall time by default)."""
        with self._lock:
            return {
                "marks": {u: [m.xid, m.at, m.reason] for u, m in self._xids.items()},
                "last": dict(self._last_xid),
            }

    def restore_xids(self, data: object) -> None:
        """Reload exported history; malformed entries are skipped. A restored mark still holds its
        GPU unhealthy until `xid_hold_seconds` after the original event."""
        if not isinstance(data, dict):
            return
        with self._lock:
            for uuid, mark in (data.get("marks") or {}).items():
                well_formed = isinstance(mark, list) and len(mark) == 3 and isinstance(mark[0], int)
                if well_formed and isinstance(mark[1], int | float) and isinstance(mark[2], str):
                    self._xids.setdefault(str(uuid), _XidMark(mark[0], float(mark[1]), mark[2]))
            for uuid, xid in (data.get("last") or {}).items():
                if isinstance(xid, int):
                    self._last_xid.setdefault(str(uuid), xid)

    def last_xid(self, uuid: str) -> int | None:
        with self._lock:
            return self._last_xid.get(uuid)

    def update(self, key: tuple[str, str], healthy: bool, reason: str, message: str = "") -> Verdict:
        """Set a device's verdict, keeping `since` unless health flipped."""
        now = self.clock()
        last_xid = self.last_xid(key[1]) if key[0] == "gpu" else None
        with self._lock:
            old = self._verdicts.get(key)
            since = old.since if old is not None and old.healthy == healthy else now
            verdict = Verdict(healthy, reason, message, since, last_xid)
            self._verdicts[key] = verdict
        return verdict

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._verdicts.pop(key, None)

    def get(self, key: tuple[str, str]) -> Verdict | None:
        with self._lock:
            return self._verdicts.get(key)


class EventWatcher(threading.Thread):
    """Waits for NVML critical events and records them in a HealthBook."""

    def __init__(
        self,
        nvml: Any,
        gpu_uuids: Callable[[], dict[int, str]],
        book: HealthBook,
        *,
        ignored_xids: tuple[int, ...],
        wait_ms: int = 1000,
    ) -> None:
        super().__init__(name="nvml-events", daemon=True)
        self.nvml = nvml
        self.gpu_uuids = gpu_uuids
        self.book = book
        self.ignored = frozenset(ignored_xids)
        self.wait_ms = wait_ms
        self._halt = threading.Event()
        self.unsupported: dict[int, str] = {}  # GPU index -> why events are not delivered
        self.ready = threading.Event()

    @property
    def started(self) -> bool:
        return self.ident is not None

    def state(self) -> str:
        return "watching" if not self.unsupported else f"{len(self.unsupported)} GPU(s) without events"

    def stop(self) -> None:
        self._halt.set()

    def _register(self) -> Any:
        nv = self.nvml
        event_set = nv.nvmlEventSetCreate()
        wanted = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
        for index in self.gpu_uuids():
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                mask = nv.nvmlDeviceGetSupportedEventTypes(handle) & wanted
                if not mask:
                    self.unsupported[index] = "the GPU reports no Xid or ECC events"
                    continue
                nv.nvmlDeviceRegisterEvents(handle, mask, event_set)
                self.unsupported.pop(index, None)
            except pynvml.NVMLError as exc:
                self.unsupported[index] = describe(exc)
        return event_set

    def run(self) -> None:
        nv = self.nvml
        backoff = 1.0
        while not self._halt.is_set():
            try:
                event_set = self._register()
            except pynvml.NVMLError as exc:
                log.warning("cannot create an NVML event set: %s", describe(exc))
                self._halt.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            self.ready.set()
            backoff = 1.0
            try:
                self._loop(event_set)
            finally:
                with contextlib.suppress(pynvml.NVMLError):
                    nv.nvmlEventSetFree(event_set)
            self._halt.wait(backoff)

    def _loop(self, event_set: Any) -> None:
        nv = self.nvml
        while not self._halt.is_set():
            try:
                data = nv.nvmlEventSetWait(event_set, self.wait_ms)
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError as exc:
                log.warning("NVML event wait failed (%s); re-registering", describe(exc))
                return
            try:
                uuid = nv.nvmlDeviceGetUUID(data.device)
                uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            except pynvml.NVMLError as exc:
                log.warning("event for an unidentifiable GPU: %s", describe(exc))
                continue
            if data.eventType & nv.nvmlEventTypeDoubleBitEccError:
                log.warning("GPU %s: double-bit ECC error", uuid)
                self.book.record_event(uuid, int(data.eventData), DBE)
            elif data.eventType & nv.nvmlEventTypeXidCriticalError:
                xid = int(data.eventData)
                if xid in self.ignored:
                    log.info("GPU %s: application Xid %d ignored", uuid, xid)
                    continue
                log.warning("GPU %s: critical Xid %d", uuid, xid)
                self.book.record_event(uuid, xid, XID)
