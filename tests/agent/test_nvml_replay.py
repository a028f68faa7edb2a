"""The NVML replay stands in for pynvml: same calls, the real NVMLError classes, injectable faults."""

from __future__ import annotations

import threading

import pynvml
import pytest

from agent.discovery import gpu_facts as nv
from agent.fixtures.nvml_replay import NvmlReplay
from tests.agent.support import FIXTURES


@pytest.fixture
def replay() -> NvmlReplay:
    r = NvmlReplay.load(FIXTURES / "dgx-h100" / "nvml.json")
    r.nvmlInit()
    return r


def test_errors_are_the_real_pynvml_classes(replay: NvmlReplay) -> None:
    h = replay.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        replay.nvmlDeviceGetHandleByIndex(8)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        replay.nvmlDeviceGetNvLinkState(h, 18)  # past the last of 18 links
    replay.fail(0, "nvmlDeviceGetUtilizationRates", "NOT_SUPPORTED")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        replay.nvmlDeviceGetUtilizationRates(h)
    replay.lose(0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        replay.nvmlDeviceGetUUID(h)
    replay.restore(0)
    assert replay.nvmlDeviceGetUUID(h).startswith("GPU-")


def test_uninitialised_and_missing_library() -> None:
    r = NvmlReplay.load(FIXTURES / "dgx-h100" / "nvml.json")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        r.nvmlDeviceGetCount()
    cpu_only = NvmlReplay.load(FIXTURES / "cpu-only" / "nvml.json")
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        cpu_only.nvmlInit()
    assert nv.init(cpu_only) == "NVML Shared Library Not Found"


def test_the_real_pynvml_module_fails_the_same_way_without_a_driver() -> None:
    """No GPU machine here: the real module's init error is exactly what the replay reproduces."""
    reason = nv.init(pynvml)
    if reason == "":  # pragma: no cover - only on a machine with a driver
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present")
    assert reason in ("NVML Shared Library Not Found", "Driver Not Loaded")


def test_events_block_then_deliver_and_time_out(replay: NvmlReplay) -> None:
    es = replay.nvmlEventSetCreate()
    h = replay.nvmlDeviceGetHandleByIndex(3)
    replay.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    with pytest.raises(pynvml.NVMLError_Timeout):
        replay.nvmlEventSetWait(es, 10)
    threading.Timer(0.05, replay.emit, args=(3, 79)).start()
    data = replay.nvmlEventSetWait(es, 2000)
    assert data.eventData == 79 and data.eventType == pynvml.nvmlEventTypeXidCriticalError
    assert replay.nvmlDeviceGetUUID(data.device) == replay.nvmlDeviceGetUUID(h)
    replay.emit(5, 79)  # GPU 5 was not registered: nothing arrives
    with pytest.raises(pynvml.NVMLError_Timeout):
        replay.nvmlEventSetWait(es, 10)


def test_gpu_facts_from_the_replay(replay: NvmlReplay) -> None:
    facts = nv.gpu_facts(replay, 0)
    assert facts.complete and facts.bus_id == "0000:1b:00.0" and facts.minor == 0
    assert len(facts.links) == 18 and facts.nvlink_version == 4
    assert {link.remote_type for link in facts.links} == {"switch"}
    replay.fail(0, "nvmlDeviceGetMinorNumber", "UNKNOWN")
    partial = nv.gpu_facts(replay, 0)
    assert not partial.complete and partial.error == "Unknown Error"
