"""The device plugins as one service of the agent: servers, registration, admission, cross-check and
checkpoint, fed by the agent's discovery passes (`update`) and started after the first one.

What was served is journaled before each Allocate answers (agent/journal.py: in the kernel at once,
so it survives the agent dying; on disk milliseconds later, one sync per burst), and folded into the
checkpoint off the call. On start,
before the plugins serve: the checkpoint, then the journal's records, then what kubelet's
PodResources says its pods hold (kubelet keeps that across an agent restart, and it also covers a
lost state directory); the union is saved and the journal starts empty."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import checkpoint, host_paths
from agent.checkpoint import DEFAULT_STATE_DIR
from agent.deviceplugin.admission import Admission, Refused
from agent.deviceplugin.cdi import DEFAULT_CDI_ROOTS, CdiRegistry
from agent.deviceplugin.crosscheck import CrossChecker, CrossCheckLoop
from agent.deviceplugin.events import NO_EVENTS, EventSink, PodEvents
from agent.deviceplugin.grants import GrantBuilder
from agent.deviceplugin.inventory import SERVED_RESOURCES, inventory_from_device
from agent.deviceplugin.node_writes import NodeWrites
from agent.deviceplugin.plugin import DeviceList
from agent.deviceplugin.podresources import (
    DEFAULT_POD_RESOURCES_SOCKET,
    PodResourcesClient,
    PodResourcesError,
)
from agent.deviceplugin.registration import Registrar
from agent.deviceplugin.served import ServedPod
from agent.discovery.device_health import HealthBook
from agent.journal import Journal
from agent.kube import TRANSPORT_ERRORS, Kube, short_error
from agent.parts import MidTierSource, NoMidTier, PodSnapshot, no_snapshot
from apis import keys
from apis.device import Device

log = logging.getLogger(__name__)

DEFAULT_PLUGIN_DIR = host_paths.DEVICE_PLUGINS
JOURNAL_NAME = "agent-served.journal"


@dataclass
class DevicePluginSettings:
    plugin_dir: str = DEFAULT_PLUGIN_DIR
    pod_resources_socket: str = DEFAULT_POD_RESOURCES_SOCKET
    cdi_roots: tuple[str, ...] = DEFAULT_CDI_ROOTS
    dev_root: str = host_paths.DEV  # where the agent sees the host's /dev
    host_dev: str = host_paths.DEV  # the host's path for it (what kubelet is told)
    state_dir: str = DEFAULT_STATE_DIR
    resources: tuple[str, ...] = SERVED_RESOURCES
    check_seconds: float = 1.0
    crosscheck_seconds: float = 30.0
    crosscheck_delay_seconds: float = 2.0
    # a pod without an allocation for this node gets devices the node chooses (False: refused)
    choose_on_node: bool = True


class DevicePluginService:
    def __init__(
        self,
        settings: DevicePluginSettings,
        *,
        node_name: str,
        sysfs_root: str | Path,
        kube: Kube | None,
    ) -> None:
        self.settings = settings
        self.node_name = node_name
        self.kube = kube
        self.resources = settings.resources
        self.checkpoint_path = Path(settings.state_dir) / checkpoint.FILE_NAME
        events: EventSink = PodEvents(kube, node_name) if kube is not None else NO_EVENTS
        self.grants = GrantBuilder(
            cdi=CdiRegistry(settings.cdi_roots),
            dev_root=settings.dev_root,
            host_dev=settings.host_dev,
            sysfs_root=sysfs_root,
        )
        self.pod_resources = PodResourcesClient(settings.pod_resources_socket)
        self.journal = Journal(settings.state_dir, JOURNAL_NAME)
        self.admission = Admission(
            list_pods=self.list_pods,
            grants=self.grants,
            kubelet_pods=self.pod_resources.list,
            events=events,
            on_served=self._served,
            record=self.journal.append,
            node_name=node_name,
            choose_on_node=settings.choose_on_node,
        )
        self.lists = {r: DeviceList() for r in self.resources}
        self.registrar = Registrar(
            settings.plugin_dir, self.admission, self.lists, check_seconds=settings.check_seconds
        )
        self.checker = CrossChecker(
            client=self.pod_resources,
            admission=self.admission,
            patch_annotation=self._patch_annotation if kube is not None else None,
            events=events,
        )
        self.crosscheck = CrossCheckLoop(
            self.checker, interval=settings.crosscheck_seconds, delay=settings.crosscheck_delay_seconds
        )
        self.writer = _CheckpointWriter(self.save)
        self.node_writes = NodeWrites(
            node=node_name,
            served=self._served_now,
            pods=self._pods_now,
            patch=self._patch_pod_annotations,
            events=events,
        )
        # the agent's, once attached (`attach`); until then nothing of them is kept
        self.mid: MidTierSource = NoMidTier()
        self.book = HealthBook(xid_hold_seconds=0.0)
        self._started = False
        self._save_lock = threading.Lock()

    # -- inputs -----------------------------------------------------------------------------
    def list_pods(self) -> list[dict[str, Any]]:
        if self.kube is None:
            return []
        try:
            return list(self.kube.list_pods_on(self.node_name).get("items") or [])
        except TRANSPORT_ERRORS as exc:
            raise Refused(f"cannot list the pods of node {self.node_name}: {short_error(exc)}") from None

    def update(self, device: Device) -> None:
        """A new discovery pass: new inventory and health for every plugin's ListAndWatch."""
        inv = inventory_from_device(device)
        self.admission.inventory = inv
        for resource, devices in self.lists.items():
            devices.publish(inv.devices(resource))

    # -- lifecycle --------------------------------------------------------------------------
    # kubelet's Topology Manager aligns what the plugins hand out (their devices carry NUMA hints)
    topology_hints = True

    def on_registered(self, callback: Callable[[], None]) -> None:
        """Nothing to re-check: kubelet asks each plugin for its devices when it registers."""

    def attach(self, *, mid: MidTierSource, book: HealthBook, pods: PodSnapshot = no_snapshot) -> None:
        """Give the service the agent's mid-tier, health book and pod watch (`pods`: the node's pods
        while the watch is in step, else None), and restore the served pods, mid-tier windows and
        Xid history from the checkpoint and the served journal."""
        self.mid, self.book = mid, book
        self.admission.watched_pods = pods
        loaded = checkpoint.load(self.checkpoint_path)
        if loaded is not None:
            self._restore(loaded[0], loaded[1], mid, book)
        replayed = 0
        for entry in self.journal.replay():
            try:
                self.admission.restore(entry)
                replayed += 1
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                log.warning("served journal: record dropped: %s", exc)
        log.info(
            "checkpoint restored: %d served pods (%d journal records)", len(self.admission.served), replayed
        )

    def _restore(self, state: dict[str, Any], saved_at: float, mid: MidTierSource, book: HealthBook) -> None:
        served = state.get("served") or {}
        if isinstance(served, dict):
            for uid, entry in served.items():
                try:
                    self.admission.served[str(uid)] = ServedPod.from_wire(entry)
                except ValueError as exc:
                    log.warning("checkpoint: served pod %s dropped: %s", uid, exc)
        book.restore_xids(state.get("xid"))
        mid.restore_windows(state.get("midTier"), downtime=max(0.0, time.time() - saved_at))

    def start(self) -> None:
        """Adopt kubelet's assignments, make the whole served state durable, then serve."""
        if self._started:
            return
        self._started = True
        self._adopt()
        self.save()  # what the journal held is in the checkpoint now: the journal may start empty
        try:
            self.journal.open()
        except OSError as exc:  # every Allocate will be refused with this reason until it opens
            log.warning("served journal in %s cannot be opened: %s", self.settings.state_dir, exc)
        self.writer.start()
        if self.kube is not None:
            self.node_writes.start()  # first: what an earlier agent chose and did not write yet
        self.registrar.start()
        self.crosscheck.start()

    def _adopt(self) -> None:
        """What kubelet holds for this node's pods, before the first answer; when PodResources or
        the API is not there yet, the first Allocate that reads kubelet's list adopts it."""
        try:
            self.admission.adopt(self.pod_resources.list())
        except (PodResourcesError, Refused) as exc:
            log.warning(
                "kubelet's assignments not adopted at start (%s): the journal and checkpoint hold", exc
            )

    def stop(self) -> None:
        for devices in self.lists.values():
            devices.close()
        if self._started:
            self.registrar.stop()
            self.crosscheck.stop()
            self.node_writes.stop()
            self.writer.stop()
        self.pod_resources.close()
        self.save()
        self.journal.close()

    def save(self) -> None:
        """Write the checkpoint; the journal's records from before it are then dropped."""
        with self._save_lock:
            with self.admission.calls_held():  # no served container between the two
                served = self.admission.served_snapshot()
                release = self.journal.rotate()
            state: dict[str, Any] = {
                "served": {uid: s.to_wire() for uid, s in served.items()},
                "xid": self.book.export_xids(),
                "midTier": self.mid.export_windows(),
            }
            try:
                checkpoint.save(self.checkpoint_path, state)
                release()
            except OSError as exc:
                log.warning("checkpoint %s not written: %s", self.checkpoint_path, exc)

    def _served(self) -> None:
        self.writer.request()  # the checkpoint off the Allocate path (the journal holds it meanwhile)
        self.node_writes.poke()
        self.crosscheck.poke()

    def _served_now(self) -> dict[str, ServedPod]:
        with self.admission.calls_held():
            return self.admission.served_snapshot()

    def _pods_now(self) -> list[dict[str, Any]] | None:
        watched = self.admission.watched_pods()
        if watched is not None:
            return watched[1]
        try:
            return self.list_pods()
        except Refused:
            return None

    def _patch_pod_annotations(
        self, namespace: str, name: str, uid: str, annotations: dict[str, str]
    ) -> None:
        assert self.kube is not None
        self.kube.patch_pod(namespace, name, {"metadata": {"uid": uid, "annotations": annotations}})

    def _patch_annotation(self, namespace: str, name: str, value: str) -> None:
        """The cross-check's correction: kubelet's devices on this node."""
        assert self.kube is not None
        annotations = {keys.DEVICE_ALLOCATED: value, keys.ALLOCATED_NODE: self.node_name}
        try:
            self.kube.patch_pod(namespace, name, {"metadata": {"annotations": annotations}})
        except TRANSPORT_ERRORS as exc:
            log.warning("pod %s/%s: annotation not corrected: %s", namespace, name, short_error(exc))

    def state(self) -> dict[str, Any]:
        return {
            "registered": sorted(self.registrar.registered()),
            "error": self.registrar.error or self.checker.error,
            "served": len(self.admission.served),
            "refusals": self.admission.refusals,
            "mismatches": len(self.checker.mismatches),
            "namedWithoutPodResources": self.admission.unidentified_fallbacks,
            "chosenOnNodeWritesPending": self.node_writes.pending(),
        }


class _CheckpointWriter(threading.Thread):
    """Saves after a burst of `request`s: once none came for `quiet` seconds, or `longest` after the
    first. The journal already holds each served container, so the checkpoint (an fsync and a
    rename, about 10 ms) waits for kubelet to stop admitting rather than compete with its calls for
    the disk; and a request during a burst only notes the time, so it wakes no thread on the call
    path."""

    def __init__(self, save: Callable[[], None], *, quiet: float = 0.5, longest: float = 5.0) -> None:
        super().__init__(name="checkpoint-writer", daemon=True)
        self.save = save
        self.quiet = quiet
        self.longest = longest
        self._wanted = threading.Event()
        self._halt = threading.Event()
        self._last = 0.0
        self._busy = False

    def request(self) -> None:
        self._last = time.monotonic()
        if not self._busy:
            self._wanted.set()

    def run(self) -> None:
        while not self._halt.is_set():
            if not self._wanted.wait(0.5):
                continue
            self._wanted.clear()
            self._busy = True
            first = time.monotonic()
            while not self._halt.is_set():
                now = time.monotonic()
                until = min(self._last + self.quiet, first + self.longest)
                if now >= until:
                    break  # quiet, or long enough: the burst is over
                self._halt.wait(until - now)
            self._busy = False  # a request from here on wakes the next round
            self.save()

    def stop(self) -> None:
        self._halt.set()
        self._wanted.set()
        if self.is_alive():
            self.join(5.0)
