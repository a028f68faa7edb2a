"""The allocator service with gang scheduling plugged in.

The one module that imports both `allocator.service` and `allocator.gang`: the service defines
the seam (`GangHooks`, allocator/service/gang_hooks.py) and never imports the gang package; the
gang package implements the seam on top of the service's cache, API client and events.
"""

from __future__ import annotations

from allocator.gang.hooks import GangScheduling
from allocator.service.config import ServiceConfig
from allocator.service.kube import KubeApi
from allocator.service.metrics import Metrics
from allocator.service.server import Allocator


def build_allocator(config: ServiceConfig, api: KubeApi, *, metrics: Metrics | None = None) -> Allocator:
    """The service as `topoalloc allocator` runs it: gang scheduling on unless the config turns it
    off (`gang.enabled: false`)."""
    return Allocator(config, api, metrics=metrics, gang=GangScheduling)
