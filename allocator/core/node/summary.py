"""The per-device-type half of a node's live state: what a type's summary must do, and the
comparisons on free resources that every type shares.

`NodeState` keeps one summary per device type that has one (`summaries.SUMMARIES`), made fresh
for each inventory and told about every device of that type whose usage changed; it never looks
inside. Readers that need a type's summary take it typed from its class (`GPUSummary.of(state)`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from allocator.core.request.pod_request import Resources


class DeviceSummary(Protocol):
    """Node summaries of one device type, kept up to date device by device."""

    def update(
        self,
        minor: int,
        total: Mapping[str, int],
        used: Mapping[str, int],
        free: dict[str, int],
        old: Mapping[str, int] | None,
    ) -> None:
        """Device `minor` now has `free` out of `total` with `used` taken; `old` is what was free
        before (None: the device is new to this summary)."""
        ...

    def forget(self) -> None:
        """Drop values derived from the summaries and cached (they are recomputed on use)."""
        ...


class Summarised(Protocol):
    """Anything holding summaries by device type (a `NodeState`)."""

    @property
    def summaries(self) -> Mapping[str, Any]: ...


def fits_free(request: Resources, free: Mapping[str, int]) -> bool:
    """Koordinator's `request <= free`: only names the device reports are compared."""
    for name, value in request:
        have = free.get(name)
        if have is not None and value > have:
            return False
    return True


def all_zero(free: Mapping[str, int]) -> bool:
    return not any(free.values())
