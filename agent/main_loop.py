"""The agent's main loop: discover, build, publish; again on every resync tick or hot-plug event.

Threads: the main loop (this), NVML's blocking event wait, the udev monitor, the pod watch (for
mid-tier) and the health endpoint. They only ever set the loop's trigger; all discovery and
publishing happens on the main loop, one pass at a time.

The node's mode (`config.mode`, labelled on the Node) decides what besides the Device is published:
in `device-plugin` mode the Node's extended resources and, when given, the device plugins; in `dra`
mode the node's ResourceSlices (no device extended resources) and, when given, the DRA plugin.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.cluster_side import Cluster, ClusterSide, Offline
from agent.config import AgentConfig
from agent.discovery.device_health import NVML_UNAVAILABLE, EventWatcher, HealthBook
from agent.discovery.discoverer import Discoverer, Snapshot
from agent.discovery.hotplug import HotplugMonitor
from agent.dra.slices import pool_devices
from agent.kube import Kube
from agent.kubelet_config import KubeletConfigReader
from agent.metrics import record_devices
from agent.parts import NO_PLUGIN, NOT_STARTED, KubeletPlugin, PodSource, Worker
from agent.publish.device_builder import (
    HEALTHY_CONDITION,
    NodeRef,
    build_device,
    node_labels,
    node_resources,
)
from agent.publish.kubelet_labels import kubelet_labels
from apis import dra, keys, resources
from apis.device import Condition, Device
from apis.timestamps import format_time

log = logging.getLogger(__name__)

DEBOUNCE_SECONDS = 0.1


@dataclass
class PassResult:
    snapshot: Snapshot
    device: Device
    labels: dict[str, str | None]
    extended: dict[str, str | None]
    errors: list[str] = field(default_factory=list)
    wrote: bool = False
    pool: list[dict[str, Any]] = field(default_factory=list)  # dra mode: the ResourceSlices' devices


def carry_over(previous: Device | None, device: Device, snap: Snapshot, now: float) -> Device:
    """Keep the previous Device's GPUs (unhealthy) when NVML cannot be read at all, so a restart
    during a driver problem does not publish an empty Device over a good one."""
    if previous is None or snap.nvml_available:
        return device
    have = {(d.type, d.minor) for d in device.devices}
    kept = []
    for dev in previous.devices:
        if dev.type != resources.DeviceType.GPU.value or (dev.type, dev.minor) in have:
            continue
        dev = copy.deepcopy(dev)
        if dev.health or not dev.conditions or dev.conditions[0].reason != NVML_UNAVAILABLE:
            dev.conditions = [
                Condition(HEALTHY_CONDITION, "False", NVML_UNAVAILABLE, snap.nvml_reason, format_time(now))
            ]
        dev.health = False
        kept.append(dev)
    if not kept:
        return device
    out = copy.deepcopy(device)
    out.devices = kept + out.devices
    for key in (keys.GPU_VENDOR, keys.GPU_MODEL, keys.GPU_DRIVER_VERSION, keys.GPU_PARTITION_POLICY):
        if key in previous.labels and key not in out.labels:
            out.metadata.setdefault("labels", {})[key] = previous.labels[key]
    if keys.GPU_PARTITIONS in previous.annotations:
        out.metadata.setdefault("annotations", {}).setdefault(
            keys.GPU_PARTITIONS, previous.annotations[keys.GPU_PARTITIONS]
        )
    return out


class Agent:
    def __init__(
        self,
        *,
        node_name: str,
        nvml: Any | None,
        sysfs_root: str | Path,
        config: AgentConfig,
        kube: Kube | None = None,
        clock: Callable[[], float] = time.time,
        device_plugins: KubeletPlugin = NO_PLUGIN,
        dra_plugin: KubeletPlugin = NO_PLUGIN,
    ) -> None:
        """`kube`: the API client (None: publish nothing, `--once --print`); the plugins: kubelet's
        device plugins (device-plugin mode) or DRA plugin (dra mode), none by default."""
        if config.mode == dra.MODE_DRA and device_plugins is not NO_PLUGIN:
            raise ValueError("a node in dra mode serves no device plugins")
        if config.mode != dra.MODE_DRA and dra_plugin is not NO_PLUGIN:
            raise ValueError(f"a node in {config.mode} mode serves no DRA plugin")
        self.node_name = node_name
        self.config = config
        self.clock = clock
        self.book = HealthBook(xid_hold_seconds=config.health.xid_hold_seconds, clock=clock)
        self.discoverer = Discoverer(nvml, sysfs_root, config, self.book, clock)
        # the one place the parts are chosen: what follows asks each the same questions
        self.device_plugins = device_plugins
        self.dra_plugin = dra_plugin
        self.cluster: Cluster = (
            ClusterSide(kube, node_name, config, clock=clock, watch_pods=bool(device_plugins.resources))
            if kube is not None
            else Offline()
        )
        self.kubelet = KubeletConfigReader(config.kubelet)  # its Topology Manager, on the Node
        self.events: Worker = NOT_STARTED
        self.hotplug: Worker = NOT_STARTED
        self.trigger = threading.Event()
        self.stopping = threading.Event()
        self.last_pass: PassResult | None = None
        self.last_pass_at = 0.0
        self.passes = 0
        # kubelet device plugins (agent/deviceplugin): restored from their checkpoint now, started
        # after the first pass, so that they never advertise an empty inventory
        self.device_plugins.attach(mid=self.cluster.mid, book=self.book, pods=self.cluster.pods.snapshot)
        # the kubelet DRA plugin: started after the first pass too; a registration with kubelet
        # (which deletes a node's slices when it starts) has the slices checked at once
        self.dra_plugin.on_registered(self._registered)

    @property
    def pods(self) -> PodSource:
        return self.cluster.pods

    @property
    def published_once(self) -> bool:
        return self.cluster.published_once

    # -- triggers ---------------------------------------------------------------------------
    def request_resync(self, action: str = "", subsystem: str = "", path: str = "") -> None:
        if subsystem == "pci":
            self.discoverer.rescan_requested = True  # a GPU may have come or gone
        self.trigger.set()

    def _registered(self) -> None:
        self.cluster.mark_slices_stale()
        self.trigger.set()

    # -- one pass ---------------------------------------------------------------------------
    def run_once(self) -> PassResult:
        now = self.clock()
        snap = self.discoverer.discover()
        uid, previous = self.cluster.read()
        device = build_device(snap, NodeRef(self.node_name, uid), self.config)
        device = carry_over(previous, device, snap, now)
        record_devices(device)
        labels = node_labels(device)
        labels[dra.MODE_LABEL] = self.config.mode
        labels.update(
            kubelet_labels(
                self.kubelet.policies(),
                snap.topology.numa_cpus,
                serving=self.device_plugins.topology_hints,
            )
        )
        extended = node_resources(device)
        pool: list[dict[str, Any]] = []
        if self.config.mode == dra.MODE_DRA:
            extended = dict.fromkeys(extended)  # the devices are claimed through the slices
            products = {g.minor: g.facts.name for g in snap.topology.gpus}
            pool = pool_devices(
                device,
                products=products,
                max_vfs=self.config.dra.max_vfs_per_nic,
                taint_effect=self.config.dra.unhealthy_taint_effect,
            )
        self.dra_plugin.update(device)
        self.dra_plugin.start()
        if not self.cluster.pods.started and not self.stopping.is_set():
            self.cluster.pods.start()
        self.device_plugins.update(device)
        self.device_plugins.start()
        for name in self.device_plugins.resources:
            extended.pop(name, None)  # kubelet owns the resources a plugin serves
        written = self.cluster.publish(device, pool, labels, extended, uid)
        result = PassResult(snap, device, labels, extended, written.errors, written.wrote, pool)
        self.device_plugins.save()  # the mid-tier window moved on
        self.passes += 1
        self.last_pass = result
        self.last_pass_at = self.clock()
        log.debug("pass %d took %.1f ms", self.passes, snap.took_seconds * 1000)
        return result

    def _ensure_event_watcher(self) -> None:
        if self.events.started or not self.discoverer.nvml_ready or self.stopping.is_set():
            return
        events = EventWatcher(
            self.discoverer.nvml,
            self.discoverer.gpu_indices,
            self.book,
            ignored_xids=self.config.health.ignored_xids,
            wait_ms=self.config.health.event_wait_ms,
        )
        events.start()
        self.events = events

    # -- the loop ---------------------------------------------------------------------------
    def start_background(self, *, hotplug: bool = True) -> None:
        if hotplug and not self.hotplug.started:
            monitor = HotplugMonitor(self.request_resync, source=self.config.udev_source)
            monitor.start()
            self.hotplug = monitor

    def run(self, stop: threading.Event | None = None, *, hotplug: bool = True) -> None:
        stop = stop or self.stopping
        self.start_background(hotplug=hotplug)
        self.book.changed.clear()
        while not stop.is_set():
            self.trigger.clear()
            try:
                result = self.run_once()
                self._ensure_event_watcher()
                for error in result.errors:
                    log.warning("%s", error)
            except Exception:  # one bad pass must not kill the agent; the next pass retries
                log.exception("discovery/publish pass failed")
            deadline = time.monotonic() + self.config.resync_seconds
            while not stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if self.trigger.wait(min(remaining, 0.5)) or self.book.changed.is_set():
                    self.book.changed.clear()
                    stop.wait(DEBOUNCE_SECONDS)  # let a burst of uevents settle
                    break
        self.shutdown()

    def shutdown(self) -> None:
        self.stopping.set()
        for part in (self.events, self.hotplug, self.cluster.pods, self.device_plugins, self.dra_plugin):
            part.stop()
        self.events.join(timeout=2.0)
        self.discoverer.stop()

    # -- health endpoint --------------------------------------------------------------------
    def _kubelet_state(self) -> dict[str, Any]:
        got = self.kubelet.policies()
        return {
            "topologyManagerPolicy": got.topology_manager_policy,
            "topologyManagerScope": got.topology_manager_scope,
            "cpuManagerPolicy": got.cpu_manager_policy,
            "source": got.source,
        }

    def health_state(self) -> dict[str, Any]:
        now = self.clock()
        last = self.last_pass
        live = self.passes > 0 and now - self.last_pass_at < 3 * max(self.config.resync_seconds, 1.0) + 30
        if self.passes == 0:
            live = True  # starting up: the first pass has not finished yet
        ready = last is not None and self.cluster.published_once
        reason = (
            ""
            if ready
            else ("first pass not done" if last is None else "; ".join(last.errors) or "not published")
        )
        snap = last.snapshot if last is not None else None
        return {
            "live": live,
            "ready": ready,
            "notReadyReason": reason,
            "passes": self.passes,
            "lastPassAt": format_time(self.last_pass_at) if self.last_pass_at else None,
            "lastPassMillis": round(snap.took_seconds * 1000, 1) if snap else None,
            "errors": last.errors if last else [],
            "nvml": "ok" if snap and snap.nvml_available else (snap.nvml_reason if snap else "unknown"),
            "gpus": len(snap.topology.gpus) if snap else 0,
            "rdma": len(snap.topology.nics) if snap else 0,
            "hotplug": self.hotplug.state(),
            "mode": self.config.mode,
            "devicePlugin": self.device_plugins.state(),
            "kubelet": self._kubelet_state(),
            "draPlugin": self.dra_plugin.state(),
        }
