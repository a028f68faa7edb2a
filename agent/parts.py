"""The agent's optional parts, each with a null object for when it is off, so the main loop asks
every part the same questions and never checks whether it is there.

  KubeletPlugin  the device plugins (device-plugin mode) or the DRA plugin (dra mode); off: `NoPlugin`
  Worker         a background thread the agent starts on demand and stops (NVML's event wait, the
                 udev monitor); not started yet: `NOT_STARTED`
  PodSource      this node's pods as the API server holds them (the pod watch); off: `NoPods`
  MidTierSource  the mid-tier reclaimable cpu/memory (agent/midtier); off: `NoMidTier`
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from agent.midtier.pod_watch import PodInfo
from agent.midtier.reclaimable import MidResult
from apis.device import Device

# this node's pods (version, objects) while the watch is in step with the server, else None
PodSnapshot = Callable[[], "tuple[int, list[dict[str, Any]]] | None"]


def no_snapshot() -> tuple[int, list[dict[str, Any]]] | None:
    """No pod watch: never in step."""
    return None


class MidTierSource(Protocol):
    def compute(
        self, pods: list[PodInfo], allocatable_cpu_milli: int | None, allocatable_memory: int | None
    ) -> MidResult: ...

    def export_windows(self) -> dict[str, dict[str, list[list[float]]]]: ...

    def restore_windows(self, data: object, *, downtime: float = 0.0) -> int: ...


class NoMidTier:
    """The mid-tier turned off (or no cluster): nothing to publish, nothing to keep."""

    def compute(
        self, pods: list[PodInfo], allocatable_cpu_milli: int | None, allocatable_memory: int | None
    ) -> MidResult:
        return MidResult(None, None, "mid-tier off")

    def export_windows(self) -> dict[str, dict[str, list[list[float]]]]:
        return {}

    def restore_windows(self, data: object, *, downtime: float = 0.0) -> int:
        return 0


class PodSource(Protocol):
    synced: threading.Event

    @property
    def started(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def pods(self) -> list[PodInfo]: ...

    def snapshot(self) -> tuple[int, list[dict[str, Any]]] | None: ...


class NoPods:
    """No pod watch (no cluster, or nothing on the node needs the node's pods)."""

    def __init__(self) -> None:
        self.synced = threading.Event()  # never set: nothing is ever in step

    @property
    def started(self) -> bool:
        return True  # nothing to start

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def pods(self) -> list[PodInfo]:
        return []

    def snapshot(self) -> tuple[int, list[dict[str, Any]]] | None:
        return None


class KubeletPlugin(Protocol):
    """What the agent's pass asks of a kubelet plugin."""

    @property
    def resources(self) -> Sequence[str]:
        """The extended resources kubelet owns through it (the agent does not publish them)."""
        ...

    @property
    def topology_hints(self) -> bool:
        """Whether kubelet's Topology Manager aligns what it hands out (device plugins give hints;
        the Node's kubelet labels are published only then)."""
        ...

    def attach(self, *, mid: MidTierSource, book: Any, pods: PodSnapshot) -> None:
        """The agent's mid-tier, health book and pod snapshot; restore what was saved."""
        ...

    def on_registered(self, callback: Callable[[], None]) -> None:
        """Call `callback` whenever kubelet registers the plugin (anew)."""
        ...

    def update(self, device: Device) -> None: ...

    def start(self) -> None: ...

    def save(self) -> None: ...

    def stop(self) -> None: ...

    def state(self) -> dict[str, Any] | str: ...


class NoPlugin:
    """No kubelet plugin of this kind on the node."""

    resources: Sequence[str] = ()
    topology_hints = False

    def attach(self, *, mid: MidTierSource, book: Any, pods: PodSnapshot) -> None:
        pass

    def on_registered(self, callback: Callable[[], None]) -> None:
        pass

    def update(self, device: Device) -> None:
        pass

    def start(self) -> None:
        pass

    def save(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def state(self) -> str:
        return "off"


class Worker(Protocol):
    ready: threading.Event  # set once it listens (or knows it cannot)

    @property
    def started(self) -> bool: ...

    def stop(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...

    def state(self) -> str: ...


class NotStarted:
    """A background worker the agent has not started (or will never start)."""

    started = False

    def __init__(self) -> None:
        self.ready = threading.Event()  # never set

    def stop(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass

    def state(self) -> str:
        return "off"


NOT_STARTED = NotStarted()
NO_PLUGIN = NoPlugin()
