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


class InputError(ValueError):
    """Input a person gave that cannot be used, said as `<what> (<where>): <why>`: `what` names the
    input (a pod file, a flag), `where` points into it (a path, a path and a field), `why` says what
    is wrong. The CLI prints it after `error: ` and exits 2."""

    def __init__(self, what: str, where: str, why: str) -> None:
        self.what = what
        self.where = where
        self.why = why
        super().__init__(f"{what} ({where}): {why}" if where else f"{what}: {why}")
