"""Mid-tier (reclaimable) resources published on the Node as `kubernetes.io/mid-cpu` (milli-cores)
and `kubernetes.io/mid-memory` (bytes):

    MidAllocatable  = min(ProdReclaimable, NodeAllocatable × thresholdRatio)
                      + ProdUnallocated × unallocatedRatio
    ProdReclaimable = min(max(0, ProdAllocated − ProdPeak × (1 + safeMargin)), NodeUnused)
    ProdUnallocated = max(0, NodeAllocatable − ProdAllocated)
    NodeUnused      = max(0, NodeAllocatable − NodeUsage)

Prod pods are those whose priority is in the koord-prod band (9000–9999 by default). ProdAllocated
sums their requests. ProdPeak sums each prod pod's peak usage over a sliding window, read from its
cgroup v2 files (cpu.stat usage_usec as a rate, memory.current minus inactive_file as the working
set); a pod without enough samples yet counts its request as its peak (no reclaim from a pod we
have not watched). NodeUsage comes from psutil. When an input is missing (no cgroup files, no
usage sample yet) nothing is published: the resources are removed rather than guessed.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from agent.config import MidTierConfig
from agent.midtier.pod_watch import PodInfo
from apis import resources

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MidInputs:
    allocatable: int
    usage: int
    prod_allocated: int
    prod_peak: int


def mid_allocatable(
    inp: MidInputs, *, threshold_ratio: float, unallocated_ratio: float, safe_margin: float
) -> int:
    """The formula above for one resource, in the resource's integer unit (floored)."""
    # Exact arithmetic: ratios are decimals from the config (0.1 is 1/10, not 0.1000000000000000055).
    margin, threshold, share = (Fraction(str(x)) for x in (safe_margin, threshold_ratio, unallocated_ratio))
    node_unused = max(0, inp.allocatable - inp.usage)
    reclaimable = min(max(Fraction(0), inp.prod_allocated - inp.prod_peak * (1 + margin)), node_unused)
    unallocated = max(0, inp.allocatable - inp.prod_allocated)
    value = min(reclaimable, inp.allocatable * threshold) + unallocated * share
    return max(0, math.floor(value))


# -- cgroup v2 -----------------------------------------------------------------------------------
def _read(path: Path) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def _stat(text: str, key: str) -> int | None:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def pod_cgroup_dirs(root: Path, uid: str, qos: str) -> list[Path]:
    """Where kubelet puts a pod's cgroup, for the systemd and the cgroupfs drivers."""
    under = uid.replace("-", "_")
    q = qos.lower()
    if q == "guaranteed":
        return [root / "kubepods.slice" / f"kubepods-pod{under}.slice", root / "kubepods" / f"pod{uid}"]
    if q in ("burstable", "besteffort"):
        return [
            root / "kubepods.slice" / f"kubepods-{q}.slice" / f"kubepods-{q}-pod{under}.slice",
            root / "kubepods" / q / f"pod{uid}",
        ]
    return [
        root / "kubepods.slice" / f"kubepods-pod{under}.slice",
        root / "kubepods.slice" / "kubepods-burstable.slice" / f"kubepods-burstable-pod{under}.slice",
        root / "kubepods" / f"pod{uid}",
        root / "kubepods" / "burstable" / f"pod{uid}",
    ]


@dataclass(frozen=True)
class CgroupSample:
    cpu_usec: int
    working_set: int


def read_pod_cgroup(root: Path, pod: PodInfo) -> CgroupSample | None:
    for directory in pod_cgroup_dirs(root, pod.uid, pod.qos):
        cpu = _read(directory / "cpu.stat")
        mem = _read(directory / "memory.current")
        if cpu is None or mem is None:
            continue
        usage = _stat(cpu, "usage_usec")
        try:
            current = int(mem.strip())
        except ValueError:
            return None
        inactive = _stat(_read(directory / "memory.stat") or "", "inactive_file") or 0
        if usage is None:
            return None
        return CgroupSample(usage, max(0, current - inactive))
    return None


# -- sliding window -------------------------------------------------------------------------------
@dataclass
class _PodWindow:
    last: tuple[float, int] | None = None  # (time, cpu usec) of the previous sample
    cpu: deque[tuple[float, int]] = field(default_factory=deque)  # (time, milli-cores)
    mem: deque[tuple[float, int]] = field(default_factory=deque)  # (time, bytes)


@dataclass(frozen=True)
class MidResult:
    cpu_milli: int | None  # None: an input is missing, publish nothing
    memory: int | None
    reason: str = ""
    inputs: dict[str, MidInputs] = field(default_factory=dict)


class MidTier:
    def __init__(
        self,
        config: MidTierConfig,
        *,
        node_usage: Callable[[], tuple[int, int] | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.root = Path(config.cgroup_root)
        self.clock = clock
        self.node_usage = node_usage or psutil_node_usage()
        self._windows: dict[str, _PodWindow] = {}

    def is_prod(self, pod: PodInfo) -> bool:
        return self.config.prod_priority_min <= pod.priority <= self.config.prod_priority_max

    def sample(self, pods: list[PodInfo]) -> bool:
        """Take one usage sample of every prod pod; False when cgroups cannot be read at all."""
        now = self.clock()
        horizon = now - self.config.window_seconds
        live = set()
        readable = self.root.is_dir() and os.access(self.root, os.R_OK)
        for pod in pods:
            if not self.is_prod(pod) or pod.phase in resources.TERMINAL_POD_PHASES:
                continue
            live.add(pod.uid)
            sample = read_pod_cgroup(self.root, pod) if readable else None
            win = self._windows.setdefault(pod.uid, _PodWindow())
            if sample is None:
                continue
            if win.last is not None and now > win.last[0] and sample.cpu_usec >= win.last[1]:
                rate = (sample.cpu_usec - win.last[1]) / 1000.0 / (now - win.last[0])  # usec/s -> milli-cores
                win.cpu.append((now, round(rate)))
            win.last = (now, sample.cpu_usec)
            win.mem.append((now, sample.working_set))
            for series in (win.cpu, win.mem):
                while series and series[0][0] < horizon:
                    series.popleft()
        for uid in set(self._windows) - live:
            del self._windows[uid]
        return readable

    def export_windows(self) -> dict[str, dict[str, list[list[float]]]]:
        """The per-pod windows for a checkpoint, each sample as [seconds before now, value]."""
        now = self.clock()
        return {
            uid: {"cpu": [[now - t, v] for t, v in w.cpu], "mem": [[now - t, v] for t, v in w.mem]}
            for uid, w in self._windows.items()
        }

    def restore_windows(self, data: object, *, downtime: float = 0.0) -> int:
        """Reload exported windows, aged by `downtime` seconds; malformed entries are skipped.
        Returns how many pods got a window back."""
        if not isinstance(data, dict):
            return 0
        now = self.clock()
        restored = 0
        for uid, series in data.items():
            if not isinstance(series, dict):
                continue
            win = _PodWindow()
            for name, target in (("cpu", win.cpu), ("mem", win.mem)):
                for sample in series.get(name) or []:
                    if not (isinstance(sample, list | tuple) and len(sample) == 2):
                        continue
                    age, value = sample
                    if not isinstance(age, int | float) or not isinstance(value, int):
                        continue
                    age += downtime
                    if 0 <= age <= self.config.window_seconds:
                        target.append((now - age, value))
            if win.cpu or win.mem:
                self._windows[str(uid)] = win
                restored += 1
        return restored

    def _peak(self, pod: PodInfo) -> tuple[int, int]:
        """The pod's peak (cpu milli, memory) in the window; its request until it has enough samples."""
        win = self._windows.get(pod.uid)
        need = max(self.config.min_samples, 1)
        cpu = max((v for _, v in win.cpu), default=0) if win and len(win.cpu) >= need else pod.cpu_milli
        mem = max((v for _, v in win.mem), default=0) if win and len(win.mem) >= need else pod.memory
        return cpu, mem

    def compute(
        self, pods: list[PodInfo], allocatable_cpu_milli: int | None, allocatable_memory: int | None
    ) -> MidResult:
        if allocatable_cpu_milli is None or allocatable_memory is None:
            return MidResult(None, None, "Node allocatable cpu/memory unknown")
        cgroups_ok = self.sample(pods)
        prod = [p for p in pods if self.is_prod(p) and p.phase not in resources.TERMINAL_POD_PHASES]
        if prod and not cgroups_ok:
            return MidResult(None, None, f"cgroup root {self.root} not readable")
        usage = self.node_usage()
        if usage is None:
            return MidResult(None, None, "node usage not sampled yet")
        peaks = [self._peak(p) for p in prod]
        inputs = {
            resources.CPU: MidInputs(
                allocatable_cpu_milli, usage[0], sum(p.cpu_milli for p in prod), sum(c for c, _ in peaks)
            ),
            resources.MEMORY: MidInputs(
                allocatable_memory, usage[1], sum(p.memory for p in prod), sum(m for _, m in peaks)
            ),
        }
        cfg = self.config
        cpu = mid_allocatable(
            inputs[resources.CPU],
            threshold_ratio=cfg.cpu_threshold_ratio,
            unallocated_ratio=cfg.cpu_unallocated_ratio,
            safe_margin=cfg.safe_margin,
        )
        mem = mid_allocatable(
            inputs[resources.MEMORY],
            threshold_ratio=cfg.memory_threshold_ratio,
            unallocated_ratio=cfg.memory_unallocated_ratio,
            safe_margin=cfg.safe_margin,
        )
        return MidResult(cpu, mem, inputs=inputs)


def psutil_node_usage() -> Callable[[], tuple[int, int] | None]:
    """Node usage (cpu milli-cores, memory bytes) from psutil; None until a CPU interval exists."""
    import psutil

    psutil.cpu_percent(interval=None)  # starts the interval the first sample will cover
    started = time.monotonic()

    def usage() -> tuple[int, int] | None:
        if time.monotonic() - started < 0.5:
            return None  # too short an interval to mean anything
        percent = psutil.cpu_percent(interval=None)  # since the previous call
        mem = psutil.virtual_memory()
        cpus = psutil.cpu_count() or 1
        return round(percent / 100.0 * cpus * 1000), int(mem.total - mem.available)

    return usage
