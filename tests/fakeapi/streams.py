"""Reading raw watch responses (`*_without_preload_content(watch=True)`) in tests, always with a deadline."""

from __future__ import annotations

import asyncio
import json
from typing import Any

JsonObj = dict[str, Any]


async def next_event(response: Any, timeout: float = 5.0) -> JsonObj | None:
    """The next event line, or None at the end of the stream."""
    line = await asyncio.wait_for(response.content.readline(), timeout)
    return json.loads(line) if line else None


async def events(response: Any, count: int, timeout: float = 5.0) -> list[JsonObj]:
    out = []
    for _ in range(count):
        event = await next_event(response, timeout)
        if event is None:
            break
        out.append(event)
    return out


async def until_end(response: Any, timeout: float = 5.0) -> list[JsonObj]:
    out = []
    while (event := await next_event(response, timeout)) is not None:
        out.append(event)
    return out


def summary(evs: list[JsonObj]) -> list[tuple[str, str]]:
    """(type, name) per event; BOOKMARKs and ERRORs have no name."""
    return [(e["type"], e["object"].get("metadata", {}).get("name", "")) for e in evs]
