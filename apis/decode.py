"""Typed field access for decoding wire dicts, with Go's struct-field rules.

Go's encoding/json matches JSON keys to struct fields case-insensitively and ignores unknown keys;
we do the same so objects written for Koordinator and kube-scheduler decode unchanged. Every
failure is a CodecError naming the dotted field path and the bad value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from apis.errors import CodecError

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def obj(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CodecError(path, f"expected an object, not {_kind(value)}", value)
    return value


def struct(value: Any, path: str, fields: Iterable[str]) -> dict[str, Any]:
    """Return `value` re-keyed to the canonical field names (Go's case-insensitive match).

    An exact-case key wins over a case-folded one, as in Go.
    """
    data = obj(value, path)
    canon = {f.lower(): f for f in fields}
    out: dict[str, Any] = {}
    for key, val in data.items():
        name = canon.get(key.lower()) if isinstance(key, str) else None
        if name is None:
            continue
        if name in out and key != name:
            continue
        out[name] = val
    return out


def join(path: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{path}[{name}]"
    return f"{path}.{name}" if path else name


def string(
    data: Mapping[str, Any], name: str, path: str, *, required: bool = False, default: str = ""
) -> str:
    if name not in data or data[name] is None:
        if required:
            raise CodecError(join(path, name), "is required", None, show_value=False)
        return default
    val = data[name]
    if not isinstance(val, str):
        raise CodecError(join(path, name), f"expected a string, not {_kind(val)}", val)
    return val


def integer(
    data: Mapping[str, Any],
    name: str,
    path: str,
    *,
    required: bool = False,
    default: int | None = 0,
    minimum: int = INT32_MIN,
    maximum: int = INT32_MAX,
) -> int | None:
    if name not in data or data[name] is None:
        if required:
            raise CodecError(join(path, name), "is required", None, show_value=False)
        return default
    val = data[name]
    if isinstance(val, bool) or not isinstance(val, int):
        if isinstance(val, float) and val.is_integer():
            val = int(val)
        else:
            raise CodecError(join(path, name), f"expected an integer, not {_kind(val)}", val)
    if not minimum <= val <= maximum:
        raise CodecError(join(path, name), f"must be between {minimum} and {maximum}", val)
    return val


def boolean(data: Mapping[str, Any], name: str, path: str, *, default: bool = False) -> bool:
    if name not in data or data[name] is None:
        return default
    val = data[name]
    if not isinstance(val, bool):
        raise CodecError(join(path, name), f"expected true or false, not {_kind(val)}", val)
    return val


def array(data: Mapping[str, Any], name: str, path: str) -> list[Any]:
    if name not in data or data[name] is None:
        return []
    val = data[name]
    if not isinstance(val, list):
        raise CodecError(join(path, name), f"expected a list, not {_kind(val)}", val)
    return val


def str_map(data: Mapping[str, Any], name: str, path: str) -> dict[str, str]:
    if name not in data or data[name] is None:
        return {}
    val = obj(data[name], join(path, name))
    for key, item in val.items():
        if not isinstance(item, str):
            raise CodecError(join(join(path, name), key), f"expected a string, not {_kind(item)}", item)
    return dict(val)


def one_of(value: str, allowed: Iterable[str], path: str) -> str:
    allowed = tuple(allowed)
    if value not in allowed:
        raise CodecError(path, f"must be one of {', '.join(allowed)}", value)
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)
