"""The order in which waiting work is served: higher PriorityClass value first, then older first.

Priority is the pod's `spec.priority` (the API server resolves `priorityClassName` into it at
admission; `PodRequest.priority`). A gang's priority is the lowest of its members' (they normally
share one class): as a preemptor it must never remove a pod its weakest member could not, and the
queue uses the same value so the two never disagree. "Older" is whatever time the caller keeps for
the item (a gang: when it first had its minimum of members; a pod: its creation time), compared
as given, so RFC 3339 strings and epoch seconds both work as long as one kind is used throughout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def gang_priority(priorities: Iterable[int]) -> int:
    """The priority a gang is queued and preempts with: its lowest member's (0 without members)."""
    return min(priorities, default=0)


def queue_key(priority: int, since: object, name: str) -> tuple[int, object, str]:
    """Sort key: higher priority first, then the earlier `since`, then the name (stable ties)."""
    return (-priority, since, name)


def by_priority(
    items: Iterable[T],
    priority: Callable[[T], int],
    since: Callable[[T], object],
    name: Callable[[T], str],
) -> list[T]:
    """`items` in queue order (see `queue_key`)."""
    return sorted(items, key=lambda item: queue_key(priority(item), since(item), name(item)))
