"""When a gang started waiting, and its place in the queue of waiting gangs.

A gang waits from the moment it first has its minimum of members: a scheduler-plugins PodGroup
records that time as `scheduleStartTime` (read once, then kept); any other gang (a native PodGroup,
whose status has no such field, a Workload's pod group, a Koordinator gang) counts from the
creation of the member that completed its minimum. Waiting gangs are served by priority (their
lowest member's), then by that time (priority.py).
"""

from __future__ import annotations

import math
from typing import Any

from allocator.core.gang.gang_state import GangState
from allocator.core.gang.priority import gang_priority, queue_key
from allocator.core.gang.view import Clocks, Gang
from apis.timestamps import parse_time

JSON = dict[str, Any]


def recorded_status(gang: Gang, state: GangState | None) -> JSON:
    """The PodGroup status as the lifecycle last wrote it, else as the view has it."""
    if state is not None and state.status is not None:
        return state.status
    return gang.api_object.status.to_dict() if gang.api_object is not None and gang.keeps_status else {}


def start_of(gang: Gang, state: GangState | None, now: Clocks) -> float | None:
    """Wall-clock time the gang first had its minimum of members (None: not yet)."""
    active = gang.active
    if len(active) < gang.min_member:
        return None
    if gang.api_object is None or not gang.api_object.records_start:
        # Koordinator gangs, Workloads and native PodGroups keep no start time: the creation of
        # the member that completed the minimum is a time every allocator instance reads the same way.
        return parse_time(active[gang.min_member - 1].created)
    if state is not None and state.start is not None:
        return state.start
    recorded = recorded_status(gang, state).get("scheduleStartTime")
    start = parse_time(recorded) if isinstance(recorded, str) else None
    return start if start is not None else now.wall


def queue_order(gang: Gang, state: GangState | None, now: Clocks) -> tuple[object, ...]:
    """Higher priority first (the lowest of its members'), then the earliest to have its minimum
    of members (priority.py); gangs not looked at yet last among their priority."""
    start = start_of(gang, state, now) if state is not None else None
    priority = gang_priority(m.priority for m in gang.active)
    return queue_key(priority, start if start is not None else math.inf, gang.key)
