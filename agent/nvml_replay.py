"""A replay of recorded NVML facts (a fixture's nvml.json) with the call surface of `pynvml`.

The agent takes its NVML module as an argument: production passes the real `pynvml`, fixtures and
tests pass an `NvmlReplay`. Every error is raised as the real `pynvml.NVMLError` subclass (built
from the recorded error code), so the agent's `except` clauses run exactly as on hardware. A
function the replay does not implement raises AttributeError, loudly, like a missing symbol.

Tests drive faults through the replay's own methods (`fail`, `lose`, `restore`, `emit`): they
change what the next NVML call returns, never the agent's code.
"""

from __future__ import annotations

import json
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

FORMAT_VERSION = 1

NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
NVML_NVLINK_DEVICE_TYPE_GPU = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
NVML_NVLINK_DEVICE_TYPE_IBMNPU = pynvml.NVML_NVLINK_DEVICE_TYPE_IBMNPU
NVML_NVLINK_DEVICE_TYPE_SWITCH = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = pynvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN
NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
nvmlEventTypeDoubleBitEccError = pynvml.nvmlEventTypeDoubleBitEccError
nvmlEventTypeSingleBitEccError = pynvml.nvmlEventTypeSingleBitEccError

REMOTE_TYPES = {
    "gpu": NVML_NVLINK_DEVICE_TYPE_GPU,
    "ibmnpu": NVML_NVLINK_DEVICE_TYPE_IBMNPU,
    "switch": NVML_NVLINK_DEVICE_TYPE_SWITCH,
    "unknown": NVML_NVLINK_DEVICE_TYPE_UNKNOWN,
}


def error_code(name: str | int) -> int:
    """`"NOT_SUPPORTED"` (or the integer) -> pynvml's NVML_ERROR_NOT_SUPPORTED."""
    if isinstance(name, int):
        return name
    code = getattr(pynvml, "NVML_ERROR_" + name.upper(), None)
    if not isinstance(code, int):
        raise ValueError(f"unknown NVML error name {name!r}")
    return code


def nvml_error(name: str | int) -> pynvml.NVMLError:
    return pynvml.NVMLError(error_code(name))


@dataclass(frozen=True)
class Handle:
    """A device handle. Real handles are opaque ctypes pointers; the agent never looks inside."""

    index: int


class _EventSet:
    def __init__(self) -> None:
        self.queue: queue.Queue[SimpleNamespace] = queue.Queue()
        self.registered: dict[int, int] = {}  # device index -> event mask


class NvmlReplay:
    """NVML as recorded in an nvml.json document."""

    # The constants the agent reads from the module, so a replay stands in for it.
    NVMLError = pynvml.NVMLError
    NVML_NVLINK_MAX_LINKS = NVML_NVLINK_MAX_LINKS
    NVML_NVLINK_DEVICE_TYPE_GPU = NVML_NVLINK_DEVICE_TYPE_GPU
    NVML_NVLINK_DEVICE_TYPE_IBMNPU = NVML_NVLINK_DEVICE_TYPE_IBMNPU
    NVML_NVLINK_DEVICE_TYPE_SWITCH = NVML_NVLINK_DEVICE_TYPE_SWITCH
    NVML_NVLINK_DEVICE_TYPE_UNKNOWN = NVML_NVLINK_DEVICE_TYPE_UNKNOWN
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError
    nvmlEventTypeDoubleBitEccError = nvmlEventTypeDoubleBitEccError
    nvmlEventTypeSingleBitEccError = nvmlEventTypeSingleBitEccError

    def __init__(self, data: dict[str, Any]) -> None:
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(f"nvml.json: unsupported format {data.get('format')!r}")
        self._data = data
        self._devices: list[dict[str, Any]] = list(data.get("devices") or [])
        self._lock = threading.Lock()
        self._initialized = 0
        # Injected faults: (device index, function name or "*") -> error code.
        self._faults: dict[tuple[int, str], int] = {}
        for dev in self._devices:
            for func, err in (dev.get("errors") or {}).items():
                self._faults[(dev["index"], func)] = error_code(err)
        self._event_sets: list[_EventSet] = []

    @classmethod
    def load(cls, path: str | Path) -> NvmlReplay:
        with open(path, encoding="utf-8") as fh:
            return cls(json.load(fh))

    # -- fault injection (tests and fixtures) ------------------------------------------
    def fail(self, index: int, function: str, error: str | int) -> None:
        """Make `function` on device `index` raise `error` until `restore`."""
        with self._lock:
            self._faults[(index, function)] = error_code(error)

    def lose(self, index: int) -> None:
        """The GPU fell off the bus: every call on it raises GPU_IS_LOST."""
        self.fail(index, "*", "GPU_IS_LOST")

    def restore(self, index: int) -> None:
        with self._lock:
            for key in [k for k in self._faults if k[0] == index]:
                del self._faults[key]

    def unplug(self, index: int) -> None:
        """The driver stops listing GPU `index`; NVML renumbers the ones after it."""
        with self._lock:
            self._devices.pop(index)
            for i, dev in enumerate(self._devices):
                dev["index"] = i
            self._faults = {k: v for k, v in self._faults.items() if k[0] != index}

    def fail_init(self, error: str | int | None) -> None:
        """Make nvmlInit raise `error` (None: succeed again), like a driver that is not loaded."""
        self._data["initError"] = error

    def set_load(self, index: int, *, utilization: int | None = None, memory_used: int | None = None) -> None:
        with self._lock:
            dev = self._devices[index]
            if utilization is not None:
                dev.setdefault("utilization", {})["gpu"] = utilization
            if memory_used is not None:
                dev["memoryUsed"] = memory_used

    def emit(self, index: int, xid: int, event_type: int = nvmlEventTypeXidCriticalError) -> None:
        """Deliver an event (an Xid by default) for device `index` to every registered event set."""
        event = SimpleNamespace(
            device=Handle(index), eventType=event_type, eventData=xid, gpuInstanceId=0, computeInstanceId=0
        )
        with self._lock:
            sets = list(self._event_sets)
        for es in sets:
            if es.registered.get(index, 0) & event_type:
                es.queue.put(event)

    # -- helpers --------------------------------------------------------------------------
    def _check_init(self) -> None:
        if self._initialized <= 0:
            raise nvml_error("UNINITIALIZED")

    def _device(self, handle: Any, function: str) -> dict[str, Any]:
        self._check_init()
        if not isinstance(handle, Handle) or not 0 <= handle.index < len(self._devices):
            raise nvml_error("INVALID_ARGUMENT")
        with self._lock:
            code = self._faults.get((handle.index, "*")) or self._faults.get((handle.index, function))
        if code is not None:
            raise pynvml.NVMLError(code)
        return self._devices[handle.index]

    @staticmethod
    def _field(dev: dict[str, Any], key: str) -> Any:
        value = dev.get(key)
        if value is None:
            raise nvml_error("NOT_SUPPORTED")
        return value

    def _link(self, handle: Any, link: int, function: str) -> dict[str, Any]:
        dev = self._device(handle, function)
        nvlink = dev.get("nvlink")
        if not nvlink:
            raise nvml_error("NOT_SUPPORTED")
        links = nvlink.get("links") or []
        if not isinstance(link, int) or not 0 <= link < len(links):
            raise nvml_error("INVALID_ARGUMENT")
        return links[link]

    # -- system ---------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        err = self._data.get("initError")
        if err:
            raise nvml_error(err)
        self._initialized += 1

    def nvmlShutdown(self) -> None:
        self._check_init()
        self._initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return str(self._field(self._data, "driverVersion"))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check_init()
        return int(self._field(self._data, "cudaDriverVersion"))

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._check_init()
        if not isinstance(index, int) or not 0 <= index < len(self._devices):
            raise nvml_error("INVALID_ARGUMENT")
        handle = Handle(index)
        self._device(handle, "nvmlDeviceGetHandleByIndex")
        return handle

    # -- device facts -----------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return str(self._field(self._device(handle, "nvmlDeviceGetUUID"), "uuid"))

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return str(self._field(self._device(handle, "nvmlDeviceGetName"), "name"))

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return int(self._field(self._device(handle, "nvmlDeviceGetMinorNumber"), "minor"))

    def nvmlDeviceGetModuleId(self, handle: Any) -> int:
        return int(self._field(self._device(handle, "nvmlDeviceGetModuleId"), "moduleId"))

    def nvmlDeviceGetPciInfo(self, handle: Any) -> SimpleNamespace:
        dev = self._device(handle, "nvmlDeviceGetPciInfo")
        bus_id = str(self._field(dev, "pciBusId"))
        return SimpleNamespace(busId=bus_id, busIdLegacy=bus_id[-12:])

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> SimpleNamespace:
        dev = self._device(handle, "nvmlDeviceGetMemoryInfo")
        total = int(self._field(dev, "memoryTotal"))
        used = int(dev.get("memoryUsed") or 0)
        return SimpleNamespace(total=total, used=used, free=max(total - used, 0))

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> SimpleNamespace:
        util = self._field(self._device(handle, "nvmlDeviceGetUtilizationRates"), "utilization")
        return SimpleNamespace(gpu=int(util.get("gpu", 0)), memory=int(util.get("memory", 0)))

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        return int(self._field(self._device(handle, "nvmlDeviceGetNumaNodeId"), "numaNode"))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        pcie = self._field(self._device(handle, "nvmlDeviceGetCurrPcieLinkGeneration"), "pcie")
        return int(pcie["gen"])

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        pcie = self._field(self._device(handle, "nvmlDeviceGetCurrPcieLinkWidth"), "pcie")
        return int(pcie["width"])

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        dev1 = self._device(device1, "nvmlDeviceGetTopologyCommonAncestor")
        dev2 = self._device(device2, "nvmlDeviceGetTopologyCommonAncestor")
        levels = self._field(dev1, "topology")
        level = levels.get(str(dev2.get("pciBusId")))
        if level is None:
            raise nvml_error("NOT_SUPPORTED")
        return int(level)

    # -- NVLink -----------------------------------------------------------------------------
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        return int(self._link(handle, link, "nvmlDeviceGetNvLinkState").get("state", 0))

    def nvmlDeviceGetNvLinkVersion(self, handle: Any, link: int) -> int:
        self._link(handle, link, "nvmlDeviceGetNvLinkVersion")
        return int(self._device(handle, "nvmlDeviceGetNvLinkVersion")["nvlink"]["version"])

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> SimpleNamespace:
        remote = self._link(handle, link, "nvmlDeviceGetNvLinkRemotePciInfo").get("remotePciBusId")
        if not remote:
            raise nvml_error("NOT_SUPPORTED")
        return SimpleNamespace(busId=str(remote), busIdLegacy=str(remote)[-12:])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        kind = self._link(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType").get("remoteType", "unknown")
        return REMOTE_TYPES[kind]

    # -- events -----------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> _EventSet:
        self._check_init()
        es = _EventSet()
        with self._lock:
            self._event_sets.append(es)
        return es

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        dev = self._device(handle, "nvmlDeviceGetSupportedEventTypes")
        return int(dev.get("supportedEvents", nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError))

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: _EventSet) -> None:
        dev = self._device(handle, "nvmlDeviceRegisterEvents")
        supported = int(
            dev.get("supportedEvents", nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError)
        )
        if event_types & ~supported:
            raise nvml_error("NOT_SUPPORTED")
        event_set.registered[handle.index] = event_set.registered.get(handle.index, 0) | event_types

    def nvmlEventSetWait(self, event_set: _EventSet, timeoutms: int) -> SimpleNamespace:
        self._check_init()
        try:
            return event_set.queue.get(timeout=max(timeoutms, 0) / 1000.0)
        except queue.Empty:
            raise nvml_error("TIMEOUT") from None

    nvmlEventSetWait_v2 = nvmlEventSetWait

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        with self._lock:
            if event_set in self._event_sets:
                self._event_sets.remove(event_set)
