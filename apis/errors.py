"""The one error every codec in `apis` raises: it names the field and the bad value."""

from __future__ import annotations

from typing import Any


class CodecError(ValueError):
    """Malformed wire data. `field` is a dotted path such as `spec.devices[2].minor`."""

    def __init__(self, field: str, problem: str, value: Any = None, *, show_value: bool = True) -> None:
        self.field = field
        self.problem = problem
        self.value = value
        text = f"{field}: {problem}" if field else problem
        if show_value:
            text += f" (got {_short(value)})"
        super().__init__(text)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
