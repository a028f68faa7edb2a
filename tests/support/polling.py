"""Waiting in async tests: poll a condition on the event loop until it holds.

The one `until` of the suite (threads and real control planes wait with `wait_until`,
tests/support/processes.py). A check that something did NOT happen cannot be written with it: wait
for the controller's next completed pass first (the runtime's `Runner.wait_passes`), then assert.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(
    check: Callable[[], object], timeout: float = 10.0, *, what: str = "", interval: float = 0.01
) -> float:
    """Call `check` every `interval` seconds until it returns something truthy; the seconds that
    took. Past `timeout` seconds: an AssertionError naming `what` (else the check)."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or check}")
        await asyncio.sleep(interval)
    return time.monotonic() - start
