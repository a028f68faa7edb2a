"""How a component on top of the runtime starts its background work: it is handed the process's
`spawn` (allocator/assembly.py), which names the task so that /healthz reports it when it dies."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

Spawn = Callable[[str, Coroutine[Any, Any, None]], None]
