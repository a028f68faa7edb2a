"""One discovery pass: NVML + sysfs -> topology, load and health verdicts, with memory.

The `Discoverer` remembers what it has seen, so a transient failure never shrinks what the agent
publishes: a GPU whose NVML calls fail keeps its last known facts and is marked unhealthy with the
error as reason; if NVML as a whole is unusable every known GPU stays, unhealthy; a device that
vanished is reported unhealthy ("Missing") for `missing_grace_seconds` before it is dropped.
Static NVML facts are cached per GPU and re-read every `full_rescan_every` passes or on demand
(hot-plug); load is sampled every pass and doubles as the GPU's liveness probe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.config import AgentConfig
from agent.discovery import gpu_facts as nv
from agent.discovery.device_health import (
    MISSING,
    NVML_ERROR,
    NVML_UNAVAILABLE,
    PORT_DOWN,
    READY,
    TOPOLOGY_INCOMPLETE,
    HealthBook,
    Verdict,
)
from agent.discovery.gpu_facts import GpuFacts, GpuLoad
from agent.discovery.node_topology import GpuNode, NicNode, NodeTopology, build_topology
from agent.discovery.sysfs import RdmaDevice, Sysfs

log = logging.getLogger(__name__)


@dataclass
class Snapshot:
    topology: NodeTopology
    nvml_available: bool
    nvml_reason: str
    driver_version: str
    cuda_version: str
    gpu_loads: dict[int, GpuLoad]  # by minor
    verdicts: dict[tuple[str, int], Verdict]  # ("gpu"|"rdma", minor)
    problems: list[str] = field(default_factory=list)
    took_seconds: float = 0.0


@dataclass
class _Seen:
    facts: Any
    last_seen: float


class Discoverer:
    def __init__(
        self,
        nvml: Any | None,
        sysfs_root: str | Path,
        config: AgentConfig,
        book: HealthBook | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nvml = nvml
        self.sysfs_root = Path(sysfs_root)
        self.config = config
        self.clock = clock
        self.book = book or HealthBook(xid_hold_seconds=config.health.xid_hold_seconds, clock=clock)
        self.nvml_reason = "" if nvml is not None else "NVML not available"
        self.nvml_ready = False
        self.driver_version = ""
        self.cuda_version = ""
        self._gpus: dict[str, _Seen] = {}  # uuid -> last facts
        self._index_uuid: dict[int, str] = {}
        self._nics: dict[str, _Seen] = {}  # PF address -> last RdmaDevice
        self._passes = 0
        self.rescan_requested = True

    # -- NVML lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        if self.nvml is None or self.nvml_ready:
            return
        reason = nv.init(self.nvml)
        if reason:
            if reason != self.nvml_reason:
                log.warning("NVML unavailable: %s", reason)
            self.nvml_reason = reason
            return
        self.nvml_ready = True
        self.nvml_reason = ""

    def stop(self) -> None:
        if self.nvml_ready:
            try:
                self.nvml.nvmlShutdown()
            except Exception as exc:  # shutting down: nothing useful to do with it
                log.debug("nvmlShutdown: %s", exc)
            self.nvml_ready = False

    def gpu_indices(self) -> dict[int, str]:
        return dict(self._index_uuid)

    # -- one pass ---------------------------------------------------------------------------
    def discover(self) -> Snapshot:
        started = time.perf_counter()
        now = self.clock()
        self.start()  # NVML may come up later (driver installed after the agent started)
        self._passes += 1
        full = self.rescan_requested or self._passes % max(self.config.full_rescan_every, 1) == 1
        self.rescan_requested = False

        facts, loads, errors, count_error = self._nvml_pass(full, now)
        sysfs = Sysfs(self.sysfs_root)
        rdma = self._rdma_pass(sysfs, now)
        topology = build_topology(facts, sysfs, rdma)
        verdicts = self._verdicts(topology, errors, count_error, now)
        problems = list(topology.problems)
        if count_error:
            problems.append(f"NVML: {count_error}")
        snap = Snapshot(
            topology=topology,
            nvml_available=self.nvml_ready and not count_error,
            nvml_reason=self.nvml_reason or count_error,
            driver_version=self.driver_version,
            cuda_version=self.cuda_version,
            gpu_loads={g.minor: loads[g.facts.uuid] for g in topology.gpus if g.facts.uuid in loads},
            verdicts=verdicts,
            problems=problems,
        )
        snap.took_seconds = time.perf_counter() - started
        return snap

    def _nvml_pass(
        self, full: bool, now: float
    ) -> tuple[list[GpuFacts], dict[str, GpuLoad], dict[str, str], str]:
        loads: dict[str, GpuLoad] = {}
        errors: dict[str, str] = {}  # uuid -> NVML error text
        count_error = ""
        present: set[str] = set()
        if self.nvml_ready:
            driver, cuda, count, count_error = nv.system_info(self.nvml)
            self.driver_version = driver or self.driver_version
            self.cuda_version = cuda or self.cuda_version
            if not count_error:
                cached = {seen.facts.index: seen.facts for seen in self._gpus.values()}
                for index in range(count):
                    old = cached.get(index)
                    if full or old is None or not old.complete or self._index_uuid.get(index) != old.uuid:
                        fresh = nv.gpu_facts(self.nvml, index)
                    else:
                        fresh = old
                    if fresh.complete:
                        self._gpus[fresh.uuid] = _Seen(fresh, now)
                        self._index_uuid[index] = fresh.uuid
                        uuid = fresh.uuid
                    else:
                        # Partial facts: keep the last complete ones for this slot, if any.
                        uuid = self._index_uuid.get(index, "")
                        if uuid in self._gpus:
                            self._gpus[uuid].last_seen = now
                            errors[uuid] = fresh.error or "incomplete NVML facts"
                        else:
                            log.warning("GPU %d: no usable facts yet (%s)", index, fresh.error)
                            continue
                    present.add(uuid)
                    load = nv.gpu_load(self.nvml, index)
                    loads[uuid] = load
                    if load.error and uuid not in errors:
                        errors[uuid] = load.error
        else:
            count_error = ""
        facts = []
        for uuid, seen in list(self._gpus.items()):
            if uuid in present or not self.nvml_ready or count_error:
                facts.append(seen.facts)
            elif now - seen.last_seen < self.config.health.missing_grace_seconds:
                facts.append(seen.facts)
                errors[uuid] = "no longer reported by NVML"
            else:
                log.warning("GPU %s gone for %.0fs: dropped", uuid, now - seen.last_seen)
                del self._gpus[uuid]
                self.book.forget(("gpu", uuid))
        return facts, loads, errors, count_error

    def _rdma_pass(self, sysfs: Sysfs, now: float) -> list[RdmaDevice]:
        listed = (self.sysfs_root / "class/infiniband").is_dir() or not (self.sysfs_root / "class").is_dir()
        try:
            current = sysfs.rdma_devices()
        except OSError as exc:  # a sysfs read the helpers did not expect to fail
            log.warning("RDMA discovery failed: %s", exc)
            current, listed = [], False
        seen_now = {dev.location.bdf for dev in current}
        for dev in current:
            self._nics[dev.location.bdf] = _Seen(dev, now)
        out = list(current)
        for bdf, seen in list(self._nics.items()):
            if bdf in seen_now:
                continue
            if not listed or now - seen.last_seen < self.config.health.missing_grace_seconds:
                out.append(seen.facts)
            else:
                log.warning("RDMA device %s gone: dropped", bdf)
                del self._nics[bdf]
                self.book.forget(("rdma", bdf))
        out.sort(key=lambda d: d.location.bdf)
        return out

    # -- verdicts -----------------------------------------------------------------------------
    def _verdicts(
        self,
        topology: NodeTopology,
        errors: dict[str, str],
        count_error: str,
        now: float,
    ) -> dict[tuple[str, int], Verdict]:
        out: dict[tuple[str, int], Verdict] = {}
        for gpu in topology.gpus:
            out[("gpu", gpu.minor)] = self._gpu_verdict(gpu, errors, count_error)
        for nic in topology.nics:
            out[("rdma", nic.minor)] = self._nic_verdict(nic, now)
        return out

    def _gpu_verdict(self, gpu: GpuNode, errors: dict[str, str], count_error: str) -> Verdict:
        key = ("gpu", gpu.facts.uuid)
        if not self.nvml_ready or count_error:
            return self.book.update(key, False, NVML_UNAVAILABLE, self.nvml_reason or count_error)
        error = errors.get(gpu.facts.uuid)
        if error == "no longer reported by NVML":
            return self.book.update(key, False, MISSING, "the GPU is no longer reported by NVML")
        if error:
            return self.book.update(key, False, NVML_ERROR, error)
        mark = self.book.xid_mark(gpu.facts.uuid)
        if mark is not None:
            reason, message, _ = mark
            return self.book.update(key, False, reason, message)
        if gpu.location is None:
            return self.book.update(key, True, TOPOLOGY_INCOMPLETE, "; ".join(gpu.problems))
        return self.book.update(key, True, READY)

    def _nic_verdict(self, nic: NicNode, now: float) -> Verdict:
        key = ("rdma", nic.location.bdf)
        seen = self._nics.get(nic.location.bdf)
        if seen is not None and seen.last_seen < now:
            return self.book.update(key, False, MISSING, "the device is no longer in sysfs")
        ports = nic.rdma.ports
        down = [p for p in ports if not p.active]
        if not ports:
            return self.book.update(key, False, PORT_DOWN, "no ports found")
        if down:
            message = ", ".join(f"port {p.number}: {p.state or 'unknown'}" for p in down)
            return self.book.update(key, False, PORT_DOWN, message)
        return self.book.update(key, True, READY)
