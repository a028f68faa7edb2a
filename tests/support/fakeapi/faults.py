"""Fault injection and the request log: test hooks that sit in front of the real handlers."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from .errors import REASONS, status_body

JsonObj = dict[str, Any]

_TRUE = ("1", "t", "T", "true", "TRUE", "True")


def is_watch(query: dict[str, str]) -> bool:
    return query.get("watch", "") in _TRUE


@dataclass
class Fault:
    """Answer matching requests with `status` (a Status body unless `body` is given), after `delay`
    seconds; with `status` None the request proceeds normally after the delay. `disconnect` drops the
    connection instead of answering. `times` None means every matching request, forever."""

    method: str | None = None
    path: str | None = None  # a regular expression searched in the URL path
    watch: bool | None = None  # only watch requests (True), only non-watch requests (False)
    status: int | None = None
    body: Any = None
    message: str = ""
    reason: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    times: int | None = 1
    disconnect: bool = False
    hits: int = 0

    def __post_init__(self) -> None:
        self._path_re = re.compile(self.path) if self.path is not None else None

    def matches(self, method: str, path: str, query: dict[str, str]) -> bool:
        if self.method is not None and self.method.upper() != method.upper():
            return False
        if self._path_re is not None and not self._path_re.search(path):
            return False
        return self.watch is None or self.watch == is_watch(query)

    def response_body(self) -> Any:
        if self.body is not None:
            return self.body
        assert self.status is not None
        reason = self.reason or REASONS.get(self.status, "")
        message = self.message or f"injected fault: HTTP {self.status}"
        return status_body(self.status, reason, message, {})


class FaultSet:
    def __init__(self) -> None:
        self._faults: list[Fault] = []

    def add(self, fault: Fault) -> Fault:
        self._faults.append(fault)
        return fault

    def take(self, method: str, path: str, query: dict[str, str]) -> Fault | None:
        """The first fault matching this request, counting the hit (and retiring spent faults)."""
        for fault in self._faults:
            if fault.matches(method, path, query):
                fault.hits += 1
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    def clear(self) -> None:
        self._faults.clear()


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake received it, and the status it answered (0: connection dropped)."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any  # the parsed JSON body, or the raw bytes when not JSON, or None
    status: int
    at: float = field(default_factory=time.monotonic)

    @property
    def watch(self) -> bool:
        return is_watch(self.query)
