"""Go durations (Koordinator's waiting-time): apis.timestamps' parser, named here for the gang code."""

from __future__ import annotations

from apis.timestamps import parse_duration

__all__ = ["parse_duration"]
