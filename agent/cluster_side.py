"""What one agent pass writes to the cluster, and what it reads back first: the Node (its UID owns
the Device and the slices), the Device published before (kept while NVML cannot be read), the
Device CR, the node's ResourceSlices (dra mode), the Node's labels and extended resources with the
mid-tier's reclaimable cpu/memory.

`ClusterSide` does it against the API server; `Offline` (no cluster: `topoalloc agent --once
--print`) publishes nothing and is always in step. The agent builds one of the two once, from
whether it was given an API client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.config import AgentConfig
from agent.dra.slice_publisher import SlicePublisher
from agent.kube import TRANSPORT_ERRORS, Kube, Outcome, short_error, status_of
from agent.midtier.pod_watch import PodWatcher
from agent.midtier.reclaimable import MidTier
from agent.parts import MidTierSource, NoMidTier, NoPods, PodSource
from agent.publish.device_builder import NODE_LABELS
from agent.publish.publisher import Publisher
from apis import dra, keys, resources
from apis.device import Device
from apis.quantity import Quantity

log = logging.getLogger(__name__)


@dataclass
class Written:
    """What a pass's writes came to."""

    wrote: bool = False
    errors: list[str] = field(default_factory=list)

    def add(self, out: Outcome) -> bool:
        self.wrote |= out.wrote
        if out.error:
            self.errors.append(out.error)
        return not out.error


class Cluster(Protocol):
    mid: MidTierSource
    pods: PodSource

    @property
    def published_once(self) -> bool: ...

    def read(self) -> tuple[str, Device | None]:
        """Before a pass: the Node's UID ("" when unreadable) and the Device published before."""
        ...

    def publish(
        self,
        device: Device,
        pool: list[dict[str, Any]],
        labels: dict[str, str | None],
        extended: dict[str, str | None],
        uid: str,
    ) -> Written: ...

    def mark_slices_stale(self) -> None: ...


class Offline:
    """No cluster: nothing read, nothing written."""

    def __init__(self) -> None:
        self.mid: MidTierSource = NoMidTier()
        self.pods: PodSource = NoPods()
        self.published_once = True  # nothing to publish: always in step

    def read(self) -> tuple[str, Device | None]:
        return "", None

    def publish(
        self,
        device: Device,
        pool: list[dict[str, Any]],
        labels: dict[str, str | None],
        extended: dict[str, str | None],
        uid: str,
    ) -> Written:
        return Written()

    def mark_slices_stale(self) -> None:
        pass


class _NoSlices:
    def publish(self, devices: list[dict[str, Any]], node_uid: str = "") -> Outcome:
        return Outcome()

    def mark_stale(self) -> None:
        pass


class ClusterSide:
    def __init__(
        self, kube: Kube, node_name: str, config: AgentConfig, *, clock: Callable[[], float], watch_pods: bool
    ) -> None:
        """`watch_pods`: this node's pods are watched even without the mid-tier (device plugins)."""
        self.kube = kube
        self.node_name = node_name
        self.publisher = Publisher(
            kube,
            node_name,
            owned_labels=NODE_LABELS,
            owned_annotations=(keys.GPU_PARTITIONS,),
            status_min_interval=config.status_min_interval_seconds,
            status_refresh=config.status_refresh_seconds,
            clock=clock,
        )
        self.slices = SlicePublisher(kube, node_name) if config.mode == dra.MODE_DRA else _NoSlices()
        self.mid: MidTierSource = MidTier(config.mid_tier) if config.mid_tier.enabled else NoMidTier()
        # this node's pods, watched once for the mid-tier and the device plugins
        self.pods: PodSource = (
            PodWatcher(kube, node_name) if config.mid_tier.enabled or watch_pods else NoPods()
        )
        self._mid_on = config.mid_tier.enabled
        self.published_once = False
        self._previous: Device | None = None
        self._previous_loaded = False

    def read(self) -> tuple[str, Device | None]:
        self.publisher.read_node()
        self._load_previous()
        return self.publisher.node_uid(), self._previous

    def _load_previous(self) -> None:
        if self._previous_loaded:
            return
        try:
            self._previous = Device.from_dict(self.kube.get_device(self.node_name))
            self._previous_loaded = True
        except TRANSPORT_ERRORS as exc:
            if status_of(exc) == 404:
                self._previous_loaded = True
            else:
                log.warning("cannot read the existing Device: %s", short_error(exc))
        except ValueError as exc:
            log.warning("existing Device %s is malformed (%s); it will be replaced", self.node_name, exc)
            self._previous_loaded = True

    def publish(
        self,
        device: Device,
        pool: list[dict[str, Any]],
        labels: dict[str, str | None],
        extended: dict[str, str | None],
        uid: str,
    ) -> Written:
        out = Written()
        if not uid:
            out.errors.append(f"Node {self.node_name} not readable: Device not written (no owner UID)")
        else:
            if out.add(self.publisher.publish_device(device)):
                self._previous = device
                self.published_once = True
            out.add(self.slices.publish(pool, uid))
        extended.update(self._mid_tier())
        out.add(self.publisher.publish_node(labels, extended))
        return out

    def mark_slices_stale(self) -> None:
        self.slices.mark_stale()

    def _mid_tier(self) -> dict[str, str | None]:
        if not self._mid_on:
            return {}
        removed: dict[str, str | None] = {resources.MID_CPU: None, resources.MID_MEMORY: None}
        if not self.pods.synced.is_set():
            return removed
        alloc = ((self.publisher.node or {}).get("status") or {}).get("allocatable") or {}
        try:
            cpu = Quantity.parse(alloc["cpu"], "allocatable.cpu").milli_value() if "cpu" in alloc else None
            mem = Quantity.parse(alloc["memory"], "allocatable.memory").value() if "memory" in alloc else None
        except ValueError:
            cpu = mem = None
        result = self.mid.compute(self.pods.pods(), cpu, mem)
        if result.cpu_milli is None or result.memory is None:
            log.info("mid-tier: nothing published (%s)", result.reason)
            return removed
        return {resources.MID_CPU: str(result.cpu_milli), resources.MID_MEMORY: str(result.memory)}
