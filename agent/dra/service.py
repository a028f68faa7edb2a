"""The kubelet DRA plugin as one service of the agent: prepared-claim checkpoint, CDI specs,
preparer and its gRPC servers, fed by the agent's discovery passes (`update`) and started after the
first one, so that kubelet never meets a plugin that does not know the node's devices yet."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import host_paths
from agent.checkpoint import DEFAULT_STATE_DIR
from agent.dra.cdi import DEFAULT_CDI_ROOT, ClaimSpecs
from agent.dra.plugin import DEFAULT_PLUGIN_DIR, DEFAULT_REGISTRY_DIR, DraServers
from agent.dra.prepared import PreparedClaims
from agent.dra.preparer import Preparer
from agent.kube import Kube
from agent.parts import MidTierSource, PodSnapshot
from apis.device import Device

log = logging.getLogger(__name__)


@dataclass
class DraSettings:
    registry_dir: str = DEFAULT_REGISTRY_DIR  # kubelet's plugin watcher folder
    plugin_dir: str = DEFAULT_PLUGIN_DIR  # the DRA socket's folder, the same path on the host
    cdi_root: str = DEFAULT_CDI_ROOT  # where the claims' CDI specs are written
    dev_root: str = host_paths.DEV  # where the agent sees the host's /dev
    host_dev: str = host_paths.DEV  # the host's path for it (what the CDI specs name)
    state_dir: str = DEFAULT_STATE_DIR  # the prepared-claims checkpoint
    check_seconds: float = 1.0


class DraService:
    def __init__(
        self, settings: DraSettings, *, node_name: str, sysfs_root: str | Path, kube: Kube | None
    ) -> None:
        self.settings = settings
        self.store = PreparedClaims(settings.state_dir)
        self.store.load()
        self.specs = ClaimSpecs(
            settings.cdi_root, dev_root=settings.dev_root, host_dev=settings.host_dev, sysfs_root=sysfs_root
        )
        self.preparer = Preparer(
            node=node_name,
            get_claim=kube.get_resource_claim if kube is not None else _no_api,
            store=self.store,
            specs=self.specs,
        )
        self._registered: Callable[[], None] = lambda: None  # the agent re-checks its slices
        self.servers = DraServers(
            self.preparer,
            registry_dir=settings.registry_dir,
            plugin_dir=settings.plugin_dir,
            on_registered=lambda: self._registered(),
            check_seconds=settings.check_seconds,
        )
        self._started = False

    # No extended resources (devices are claimed through ResourceSlices) and no Topology Manager
    # hints: the allocation names the devices.
    resources: tuple[str, ...] = ()
    topology_hints = False

    def attach(self, *, mid: MidTierSource, book: Any, pods: PodSnapshot) -> None:
        """Nothing of the agent's is kept: prepared claims have a checkpoint of their own."""

    def on_registered(self, callback: Callable[[], None]) -> None:
        self._registered = callback

    def save(self) -> None:
        """Each prepare is saved as it is made (agent/dra/prepared.py)."""

    def update(self, device: Device) -> None:
        """A new discovery pass: prepare maps claims to this Device from now on."""
        self.preparer.device = device

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self.servers.step()  # serve at once; the keeper thread takes over from here
        self.servers.start()

    def stop(self) -> None:
        if self._started:
            self.servers.stop()

    def state(self) -> dict[str, Any]:
        reg = self.servers.registration
        return {
            "registered": reg.registered,
            "error": self.servers.error or reg.error,
            "prepared": len(self.store.claims),
            "refusals": self.preparer.refusals,
        }


def _no_api(namespace: str, name: str) -> dict[str, Any]:
    raise OSError(f"no API server to read claim {namespace}/{name} from")
