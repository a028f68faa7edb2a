"""The gang controller's eviction of a victim (the lifecycle's `Evict`, allocator/core/gang/making_room.py
decides whom): the runtime's `evict` (allocator/runtime/evictions.py), shared with Reservations."""

from __future__ import annotations

from allocator.runtime.evictions import evict

__all__ = ["evict"]
