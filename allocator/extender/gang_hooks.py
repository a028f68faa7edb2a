"""The one seam between the extender and gang scheduling.

Imports run one way: `allocator.gang` builds on the runtime (the watch cache, the API client,
events, TLS, settings) and implements `GangHooks` structurally, without importing the extender;
the extender never imports `allocator.gang`. `allocator/assembly.py`, the one module importing
both, builds the gang package's `GangScheduling` and hands it to the cache (its bind guard and a
listener), the binder and the verbs. Without gang scheduling (`gang.enabled: false`) the extender
runs with no hooks at all.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from aiohttp import web

from allocator.runtime.coreadapter import FilterVerdicts, PodRequest, Rejection
from allocator.runtime.tasks import Spawn


class GangHooks(Protocol):
    """What the extender asks of gang scheduling, step by step of a pod's way."""

    def steer_filter(self, req: PodRequest, names: Sequence[str]) -> FilterVerdicts | None:
        """filter: the verdict for a gang member (its plan's node, or none); None for other pods."""
        ...

    def steer_scores(self, req: PodRequest, names: Sequence[str], scores: np.ndarray) -> list[int] | None:
        """prioritize: the core's scores adjusted (planned node, sibling affinity); None keeps them."""
        ...

    def bind_refusal(self, req: PodRequest, node: str) -> Rejection | None:
        """bind (cache and binder): why the pod must not be bound to `node` now; None: go ahead."""
        ...

    def observe(self, kind: str, key: str, obj: dict[str, Any] | None) -> None:
        """Every change the watch cache takes in."""
        ...

    def webhook(self) -> tuple[web.Application, ssl.SSLContext]:
        """The admission webhook's application and its TLS context (the server listens)."""
        ...

    def start(self, spawn: Spawn, reload_interval: float) -> None:
        """Spawn the background work (controller, TLS reload, caBundle)."""
        ...

    def stop(self) -> None:
        """The process stops: hold nothing."""
        ...
