"""What a pod says that topoalloc ignores (apis/pod_checks.py), told once per pod as a Warning
Event: kube-scheduler calls filter on every attempt, and a pod retried for an hour would otherwise
repeat the same sentence."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from aiohttp import web

from allocator.runtime.coreadapter import PodRequest
from allocator.runtime.events import EventSink
from apis.pod_checks import EVENT_REASON

REMEMBERED = 10_000  # pods told; the oldest is forgotten first


class PodNotices:
    """The pods already told, by UID (their key when they have none)."""

    def __init__(self, limit: int = REMEMBERED) -> None:
        self.limit = limit
        self._told: OrderedDict[str, None] = OrderedDict()

    def tell(self, events: EventSink, pod: dict[str, Any], req: PodRequest) -> bool:
        """One Warning Event with the request's warnings, the first time this pod is seen with any."""
        if not req.warnings:
            return False
        who = req.uid or req.key
        if who in self._told:
            return False
        self._told[who] = None
        if len(self._told) > self.limit:
            self._told.popitem(last=False)
        events.warn(pod, EVENT_REASON, "Scheduling", "; ".join(req.warnings))
        return True


NOTICES = web.AppKey("topoalloc.notices", PodNotices)
