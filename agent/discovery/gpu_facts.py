"""GPU facts from NVML. `nvml` is the `pynvml` module on a node or an `NvmlReplay` for a fixture;
both raise `pynvml.NVMLError` subclasses, which is all this module catches.

Static facts (identity, NVLink, PCIe link) are read once per GPU and cached by the caller; load
(utilisation, memory used) is sampled every resync and doubles as the liveness probe of a GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pynvml

from agent.discovery.pci_address import normalize_bdf, parse_bdf

log = logging.getLogger(__name__)

REMOTE_GPU = "gpu"
REMOTE_SWITCH = "switch"


@dataclass(frozen=True)
class NvLink:
    link: int
    remote_bus: str  # sysfs spelling of the peer GPU or NVSwitch
    remote_type: str  # "gpu" | "switch" | "other"


@dataclass
class GpuFacts:
    index: int
    uuid: str = ""
    minor: int = -1
    name: str = ""
    bus_id: str = ""  # sysfs spelling, lower-case
    memory_total: int = 0
    nvml_numa: int | None = None
    nvlink_version: int = 0
    links: list[NvLink] = field(default_factory=list)
    pcie_gen: int = 0
    pcie_width: int = 0
    error: str = ""  # why the facts are incomplete (the NVML error), "" when complete

    @property
    def complete(self) -> bool:
        return not self.error and bool(self.uuid) and self.minor >= 0 and bool(self.bus_id)


@dataclass(frozen=True)
class GpuLoad:
    utilization: int | None  # percent
    memory_used: int | None  # bytes
    error: str = ""  # NVML error text when the GPU did not answer


def describe(exc: BaseException) -> str:
    """A stable, short text for an NVML error ("GPU is lost")."""
    if isinstance(exc, pynvml.NVMLError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def init(nvml: Any) -> str:
    """Initialise NVML; returns "" or the reason it is unusable (no library, no driver...)."""
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return describe(exc)
    except OSError as exc:  # a broken libnvidia-ml.so can fail in the loader
        return f"cannot load NVML: {exc}"
    return ""


def system_info(nvml: Any) -> tuple[str, str, int, str]:
    """(driver version, CUDA driver version "12.2", device count, error)."""
    driver = cuda = ""
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
    except pynvml.NVMLError as exc:
        log.info("driver version unavailable: %s", describe(exc))
    try:
        v = int(nvml.nvmlSystemGetCudaDriverVersion())
        cuda = f"{v // 1000}.{(v % 1000) // 10}"
    except pynvml.NVMLError as exc:
        log.info("CUDA driver version unavailable: %s", describe(exc))
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except pynvml.NVMLError as exc:
        return driver, cuda, 0, describe(exc)
    return driver, cuda, count, ""


def _links(nvml: Any, handle: Any) -> tuple[int, list[NvLink]]:
    links: list[NvLink] = []
    version = 0
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except (pynvml.NVMLError_InvalidArgument, pynvml.NVMLError_NotSupported):
            break  # past the last link, or no NVLink at all
        if not state:
            continue
        try:
            remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            bus = parse_bdf(_text(remote.busId))
            kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except pynvml.NVMLError as exc:
            log.debug("NVLink %d: remote unknown (%s)", link, describe(exc))
            continue
        if bus is None:
            continue
        if not version:
            try:
                version = int(nvml.nvmlDeviceGetNvLinkVersion(handle, link))
            except pynvml.NVMLError:
                version = 0
        remote_type = {
            nvml.NVML_NVLINK_DEVICE_TYPE_GPU: REMOTE_GPU,
            nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH: REMOTE_SWITCH,
        }.get(kind, "other")
        links.append(NvLink(link, str(bus), remote_type))
    return version, links


def gpu_facts(nvml: Any, index: int) -> GpuFacts:
    """The static facts of GPU `index`; on an NVML error the facts gathered so far, with `error`."""
    facts = GpuFacts(index=index)
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        facts.uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        facts.bus_id = normalize_bdf(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        facts.minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
        facts.name = _text(nvml.nvmlDeviceGetName(handle))
        facts.memory_total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    except pynvml.NVMLError as exc:
        facts.error = describe(exc)
        return facts
    except ValueError as exc:  # a bus id NVML should never print
        facts.error = str(exc)
        return facts
    # Optional facts: a GPU without them is still a GPU.
    try:
        facts.nvml_numa = int(nvml.nvmlDeviceGetNumaNodeId(handle))
    except (pynvml.NVMLError, AttributeError):
        facts.nvml_numa = None
    try:
        facts.pcie_gen = int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle))
        facts.pcie_width = int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle))
    except pynvml.NVMLError:
        pass
    try:
        facts.nvlink_version, facts.links = _links(nvml, handle)
    except pynvml.NVMLError as exc:
        log.info("GPU %d: NVLink unreadable (%s)", index, describe(exc))
    return facts


def gpu_load(nvml: Any, index: int) -> GpuLoad:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    except pynvml.NVMLError as exc:
        return GpuLoad(None, None, describe(exc))
    try:
        util: int | None = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except pynvml.NVMLError_NotSupported:
        util = None
    except pynvml.NVMLError as exc:
        return GpuLoad(None, int(mem.used), describe(exc))
    return GpuLoad(util, int(mem.used))
