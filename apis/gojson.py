"""JSON the way Go's encoding/json writes it, so our annotations match Koordinator's byte for byte.

Go writes compact JSON, escapes <, > and & (and U+2028/U+2029) as \\u00XX, sorts map keys and
emits struct fields in declaration order. Python dicts keep insertion order, so codecs build dicts
in Go's field order and call `sorted_map` for Go maps.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from apis.errors import CodecError

_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def dumps(obj: Any) -> str:
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    if any(ch in text for ch in _GO_ESCAPES):
        # Only string contents can hold these characters in valid JSON, so a plain replace is exact.
        for ch, esc in _GO_ESCAPES.items():
            text = text.replace(ch, esc)
    return text


def sorted_map(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """A Go map as encoding/json writes it: keys in byte order."""
    return {k: mapping[k] for k in sorted(mapping, key=lambda s: s.encode())}


def loads(text: str | bytes, field: str) -> Any:
    """Parse JSON text, turning a syntax error into a CodecError on `field`."""
    try:
        return json.loads(text)
    except (ValueError, TypeError) as exc:
        raise CodecError(field, f"invalid JSON: {exc}", text) from None
    except RecursionError:  # json recurses per nesting level; '[' * 5000 must be an error, not a crash
        raise CodecError(field, "invalid JSON: nested too deeply", text) from None
