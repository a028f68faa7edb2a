"""Agent configuration: defaults here, overridable from a YAML file (`--config`) and CLI flags.

Example file:

    mode: device-plugin         # or dra (below)
    resyncSeconds: 10
    health:
      ignoredXids: [13, 31, 43, 45, 68, 109]
      xidHoldSeconds: 300
    partitions:
      rules:
        - model: H20            # gpu-model label (exact) or a regular expression
          policy: Honor
          table: '{"1":[{"minors":[0]}], "8":[{"minors":[0,1,2,3,4,5,6,7]}]}'
    vfGroupLabels: {type: general}
    midTier:
      cpuThresholdRatio: 1.0
    dra:
      maxVfsPerNic: 8
      unhealthyTaintEffect: NoSchedule
    metrics:                    # /metrics for Prometheus, on the node's addresses (docs/monitoring.md)
      address: 0.0.0.0
      port: 9824
    kubelet:                    # kubelet's Topology Manager and CPU manager (agent/kubelet_config.py)
      configFile: /var/lib/kubelet/config.yaml
      topologyManagerPolicy: "" # set these for a kubelet configured by flags; they win over the file
      topologyManagerScope: ""
      cpuManagerPolicy: ""
      reservedSystemCPUs: ""

`mode` picks the node's device path (one node, one mode; the Node is labelled
`topoalloc.io/device-mode=<mode>`):

* `device-plugin` (the default): the Device CR, the Node's koordinator.sh/ extended resources and
  kubelet's device plugins (nvidia.com/gpu, koordinator.sh/gpu-core, koordinator.sh/gpu,
  koordinator.sh/rdma); pods ask
  with extended resources and the allocator answers kube-scheduler as an extender.
* `dra`: the Device CR (the allocator's topology source, what users inspect) and the node's
  ResourceSlices for the DRA driver topoalloc.io, served to kubelet by the agent's DRA plugin; no
  device plugin and no device extended resources on the Node. Pods ask with ResourceClaims
  (docs/dra.md). `dra.maxVfsPerNic` bounds the SR-IOV VFs published per NIC (a slice holds at most
  128 devices). `dra.unhealthyTaintEffect`: the effect of the taint an unhealthy device carries where
  the API server keeps device taints (1.36 on): `NoSchedule` (no new claim gets it) or `NoExecute`
  (the pods of claims already allocated it are evicted too); older servers lose the device instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from agent.kubelet_config import KubeletSettings
from apis.documents import load_documents
from apis.dra import MODE_DEVICE_PLUGIN, MODES
from apis.dra_taints import NO_EXECUTE, NO_SCHEDULE
from apis.partitions import GPUPartitionTable, parse_gpu_partitions

# Application XIDs that say nothing about the GPU's health (the NVIDIA device plugin's default set):
# 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive
# cleanup, 68 video processor exception, 109 context switch timeout.
DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)
UDEV_SOURCES = ("auto", "udev", "kernel")  # udevSource: auto is udev when /run/udev/control exists


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class PartitionRule:
    model: str
    policy: str = ""  # "Honor" | "Prefer" | "" (derive)
    table: GPUPartitionTable | None = None

    def matches(self, model: str) -> bool:
        return self.model == model or re.fullmatch(self.model, model) is not None


@dataclass
class HealthConfig:
    ignored_xids: tuple[int, ...] = DEFAULT_IGNORED_XIDS
    # A GPU marked unhealthy by a critical Xid comes back once it has answered NVML normally for
    # this long without another critical event (the driver sends no "recovered" event).
    xid_hold_seconds: float = 300.0
    # A device that vanished from NVML or sysfs is reported unhealthy this long, then dropped.
    missing_grace_seconds: float = 60.0
    event_wait_ms: int = 1000


@dataclass
class MidTierConfig:
    enabled: bool = True
    prod_priority_min: int = 9000  # koord-prod band
    prod_priority_max: int = 9999
    cpu_threshold_ratio: float = 1.0  # Koordinator midCPUThresholdPercent 100
    memory_threshold_ratio: float = 1.0  # midMemoryThresholdPercent 100
    cpu_unallocated_ratio: float = 0.0  # midUnallocatedPercent 0
    memory_unallocated_ratio: float = 0.0
    safe_margin: float = 0.1  # ProdPeak is inflated by this before it is compared with requests
    window_seconds: float = 600.0  # sliding window for per-pod peaks
    min_samples: int = 2  # a pod needs this many samples before its peak counts
    cgroup_root: str = "/sys/fs/cgroup"


@dataclass
class DraConfig:
    max_vfs_per_nic: int = 8
    unhealthy_taint_effect: str = NO_SCHEDULE


@dataclass
class MetricsConfig:
    # /metrics alone, for Prometheus. The agent runs on the host network, so this listens on the
    # node's addresses: all of them by default (as node-exporter does), the pod network reaching
    # the node's IP; set `address` to one of the node's IPs to narrow it. Health stays on its own
    # loopback listener (`healthAddress`), away from the node's interfaces.
    enabled: bool = True
    address: str = "0.0.0.0"
    port: int = 9824


@dataclass
class AgentConfig:
    mode: str = MODE_DEVICE_PLUGIN  # apis.dra.MODES
    resync_seconds: float = 10.0
    # Load values in status are rounded so small wiggles do not rewrite the Device.
    utilization_quantum: int = 10  # percent
    memory_quantum: int = 1 << 30  # bytes
    # Load-only status changes are written at most this often; health changes go at once.
    status_min_interval_seconds: float = 60.0
    # While nothing changes, status.updateTime is written anew this often (0: never), so a Device
    # that is not refreshed says its agent stopped (`topoalloc doctor`).
    status_refresh_seconds: float = 300.0
    full_rescan_every: int = 30  # re-read static NVML facts every N resyncs
    health: HealthConfig = field(default_factory=HealthConfig)
    mid_tier: MidTierConfig = field(default_factory=MidTierConfig)
    dra: DraConfig = field(default_factory=DraConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    kubelet: KubeletSettings = field(default_factory=KubeletSettings)
    partition_rules: list[PartitionRule] = field(default_factory=list)
    vf_group_labels: dict[str, str] = field(default_factory=lambda: {"type": "general"})
    udev_source: str = "auto"  # "udev" | "kernel" | "auto" (udev when /run/udev/control exists)
    health_port: int = 9823
    health_address: str = "0.0.0.0"

    def partition_rule(self, model: str) -> PartitionRule | None:
        return next((r for r in self.partition_rules if r.matches(model)), None)


_KEYS = {
    "mode": "mode",
    "resyncSeconds": "resync_seconds",
    "utilizationQuantum": "utilization_quantum",
    "memoryQuantum": "memory_quantum",
    "statusMinIntervalSeconds": "status_min_interval_seconds",
    "statusRefreshSeconds": "status_refresh_seconds",
    "fullRescanEvery": "full_rescan_every",
    "vfGroupLabels": "vf_group_labels",
    "udevSource": "udev_source",
    "healthPort": "health_port",
    "healthAddress": "health_address",
}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def _converted(convert: Callable[[Any], Any], value: Any, where: str, kind: str) -> Any:
    """`convert(value)`, or a ConfigError naming the key when the value is not of that kind."""
    try:
        return convert(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected {kind}, got {value!r}") from None


def _apply(target: Any, data: dict[str, Any], where: str) -> None:
    known = {_camel(f.name): f for f in fields(target)}
    for key, value in data.items():
        f = known.get(key)
        if f is None:
            raise ConfigError(f"{where}: unknown key {key!r} (expected one of {', '.join(sorted(known))})")
        current = getattr(target, f.name)
        if isinstance(current, tuple):
            as_ints = lambda v: tuple(int(x) for x in v)  # noqa: E731
            value = _converted(as_ints, value, f"{where}.{key}", "a list of numbers")
        elif isinstance(current, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{where}.{key}: expected true or false")
        elif isinstance(current, int | float) and not isinstance(value, int | float):
            raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
        setattr(target, f.name, type(current)(value) if isinstance(current, int | float | str) else value)


def load_config(path: str | Path | None) -> AgentConfig:
    cfg = AgentConfig()
    if path is None:
        return cfg
    docs = load_documents(path, "agent config")  # an unreadable file or bad YAML: InputError
    if len(docs) > 1:
        raise ConfigError(f"{path}: holds {len(docs)} YAML documents: expected one mapping")
    data = docs[0] if docs else {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    for key, value in data.items():
        if key == "health":
            _apply(cfg.health, value or {}, "health")
        elif key == "midTier":
            _apply(cfg.mid_tier, value or {}, "midTier")
        elif key == "dra":
            _apply(cfg.dra, value or {}, "dra")
        elif key == "metrics":
            _apply(cfg.metrics, value or {}, "metrics")
        elif key == "kubelet":
            _apply(cfg.kubelet, value or {}, "kubelet")
        elif key == "partitions":
            cfg.partition_rules = _rules(value or {})
        elif key in _KEYS:
            attr = _KEYS[key]
            current = getattr(cfg, attr)
            if isinstance(current, dict):
                if not isinstance(value, dict):
                    raise ConfigError(f"{key}: expected a mapping")
                setattr(cfg, attr, {str(k): str(v) for k, v in value.items()})
            else:
                kind = "a number" if isinstance(current, int | float) else "a string"
                setattr(cfg, attr, _converted(type(current), value, key, kind))
        else:
            raise ConfigError(f"{path}: unknown key {key!r}")
    if cfg.udev_source not in UDEV_SOURCES:
        raise ConfigError(f"udevSource: expected auto, udev or kernel, got {cfg.udev_source!r}")
    check_mode(cfg.mode)
    if not 0 <= cfg.metrics.port <= 65535:
        raise ConfigError(f"metrics.port: expected 0 to 65535, got {cfg.metrics.port}")
    if cfg.dra.max_vfs_per_nic < 0:
        raise ConfigError(f"dra.maxVfsPerNic: expected 0 or more, got {cfg.dra.max_vfs_per_nic}")
    if cfg.dra.unhealthy_taint_effect not in (NO_SCHEDULE, NO_EXECUTE):
        raise ConfigError(
            f"dra.unhealthyTaintEffect: expected {NO_SCHEDULE} or {NO_EXECUTE}, "
            f"got {cfg.dra.unhealthy_taint_effect!r}"
        )
    return cfg


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ConfigError(f"mode: expected {' or '.join(MODES)}, got {mode!r}")
    return mode


def _rules(data: dict[str, Any]) -> list[PartitionRule]:
    rules = []
    for i, item in enumerate(data.get("rules") or []):
        where = f"partitions.rules[{i}]"
        if not isinstance(item, dict) or not item.get("model"):
            raise ConfigError(f"{where}: needs a model")
        policy = item.get("policy", "")
        if policy not in ("", "Honor", "Prefer"):
            raise ConfigError(f"{where}.policy: expected Honor or Prefer, got {policy!r}")
        table = None
        if item.get("table") is not None:
            raw = item["table"]
            try:
                table = parse_gpu_partitions(raw if isinstance(raw, str) else json.dumps(raw))
            except ValueError as exc:
                raise ConfigError(f"{where}.table: {exc}") from None
        rules.append(PartitionRule(str(item["model"]), policy, table))
    return rules
