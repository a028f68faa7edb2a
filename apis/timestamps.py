"""Kubernetes timestamps as kube-apiserver writes them, one tolerant parser for reading them, and Go
durations (Koordinator's waiting-time, a Reservation's ttl).

`metav1.Time` (creationTimestamp, conditions' lastTransitionTime, Device status) is RFC 3339 in UTC
to the second; `metav1.MicroTime` (a Lease's renewTime, an events.k8s.io eventTime) carries exactly
six fractional digits: the API server's RFC3339Micro parser refuses a MicroTime without them.
"""

from __future__ import annotations

import datetime as dt
import math
import re

_TIME = "%Y-%m-%dT%H:%M:%SZ"
_MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


def _moment(seconds: float | None) -> dt.datetime:
    return dt.datetime.now(dt.UTC) if seconds is None else dt.datetime.fromtimestamp(seconds, dt.UTC)


def format_time(seconds: float | None = None) -> str:
    """metav1.Time of `seconds` since the epoch (now when None). The fraction is cut, not rounded,
    as Go's formatting does: 12:00:00.9 is still 12:00:00."""
    return _moment(None if seconds is None else math.floor(seconds)).strftime(_TIME)


def micro_time(seconds: float | None = None) -> str:
    """metav1.MicroTime of `seconds` since the epoch (now when None)."""
    return _moment(seconds).strftime(_MICRO_TIME)


def parse_time(value: object) -> float | None:
    """Seconds since the epoch of a Time or MicroTime (any ISO 8601 form Python reads: offsets,
    up to nanosecond fractions cut to microseconds; no offset means UTC). None for anything else:
    a malformed timestamp is the caller's "unknown", never an exception."""
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: str) -> float | None:
    """Seconds of a Go duration ("90s", "1h30m", "1.5h"); a bare number counts as seconds. None
    when it does not parse or is negative."""
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _DURATION_PART.finditer(text):
            if match.start() != pos:
                return None
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if pos != len(text):
            return None
    return seconds if seconds >= 0 else None
