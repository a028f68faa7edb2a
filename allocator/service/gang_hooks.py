"""The one seam between the service and gang scheduling.

Imports run one way: `allocator.gang` imports the service's parts (the watch cache, the API
client, events, TLS, settings) and implements `GangHooks`; the service never imports
`allocator.gang`. `allocator/assembly.py` plugs the gang package in by passing its factory
(`GangFactory`, in allocator/service/server.py) to `Allocator`, which hands the hooks to the
cache, the binder and the verbs. Without gang scheduling (`gang.enabled: false`) the service
runs with no hooks at all.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

import numpy as np
from aiohttp import web

from allocator.service.coreadapter import FilterVerdicts, PodRequest, Rejection

Spawn = Callable[[str, Coroutine[Any, Any, None]], None]


class GangHooks(Protocol):
    """What the service asks of gang scheduling, step by step of a pod's way."""

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
        """The service stops: hold nothing."""
        ...
