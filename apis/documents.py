"""Files people hand to topoalloc (a Pod, a Device CR, a config, a workload) decoded the same way
everywhere: text must be UTF-8 (a UTF-8 or UTF-16 byte-order mark is honoured, as YAML allows), the
YAML must parse, and a file that should hold one object holds exactly one of the expected kind.
Every failure is an `InputError` naming the file and, where known, the line."""

from __future__ import annotations

import codecs
import os
from pathlib import Path
from typing import Any

import yaml

from apis.errors import InputError

_BOMS = ((codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"), (codecs.BOM_UTF8, "utf-8-sig"))


def decode_text(data: bytes, what: str, where: str) -> str:
    """Bytes to text: UTF-8, or UTF-16 behind its byte-order mark."""
    encoding = next((enc for bom, enc in _BOMS if data.startswith(bom)), "utf-8")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 1].hex()
        raise InputError(
            what,
            where,
            f"not {encoding.upper().removesuffix('-SIG')} text (byte 0x{bad} at offset {exc.start})",
        ) from None


def read_text(path: str | os.PathLike[str], what: str) -> str:
    """A text file, or an InputError saying why it cannot be read."""
    where = str(path)
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise InputError(what, where, "is a directory, not a file") from None
    except OSError as exc:
        raise InputError(what, where, f"cannot read: {exc.strerror or exc}") from None
    return decode_text(data, what, where)


#: Deeper flow nesting than any Kubernetes object has; PyYAML's scanner slows down quadratically
#: with it, so deeper input is refused before parsing.
MAX_NESTING = 200


def _flow_depth(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}" and depth:
            depth -= 1
    return deepest


def parse_yaml_documents(text: str, what: str, where: str) -> list[Any]:
    """Every non-empty YAML (or JSON) document in `text`."""
    if text.count("[") + text.count("{") > MAX_NESTING and _flow_depth(text) > MAX_NESTING:
        raise InputError(what, where, f"not valid YAML or JSON: nested deeper than {MAX_NESTING} levels")
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark is not None else where
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(what, at, f"not valid YAML or JSON: {problem}") from None
    except RecursionError:
        raise InputError(what, where, "not valid YAML or JSON: nested too deeply") from None


def load_documents(path: str | os.PathLike[str], what: str) -> list[Any]:
    return parse_yaml_documents(read_text(path, what), what, str(path))


def load_mapping(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """A settings file: one YAML mapping; an empty file (or a null document) is an empty one."""
    docs = load_documents(path, what)
    if len(docs) > 1:
        raise InputError(what, str(path), f"holds {len(docs)} YAML documents: expected one mapping")
    data = docs[0] if docs else None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(what, str(path), f"expected a mapping at the top level, not {_kind_of(data)}")
    return data


def single_object(docs: list[Any], what: str, where: str, kind: str | None = None) -> dict[str, Any]:
    """The one object of a file that must hold exactly one (of `kind`, when given; an object
    without `kind` is taken to be one)."""
    if not docs:
        raise InputError(what, where, f"is empty: expected one {kind or 'object'}")
    if len(docs) > 1:
        raise InputError(what, where, f"holds {len(docs)} YAML documents: expected one {kind or 'object'}")
    obj = docs[0]
    if not isinstance(obj, dict):
        raise InputError(what, where, f"expected an object, not {_kind_of(obj)}")
    found = obj.get("kind")
    if kind is not None and found is not None and found != kind:
        if found == "List":
            raise InputError(what, where, f"is a List: expected one {kind}")
        api = obj.get("apiVersion")
        raise InputError(what, where, f"is a {f'{api} ' if api else ''}{found}, not a {kind}")
    return obj


def object_of_kind(docs: list[Any], what: str, where: str, kind: str) -> dict[str, Any]:
    """The one `kind` object of a file that may hold others beside it (a DRA example holds its
    ResourceClaimTemplate and its Pod): a file of one document is read as `single_object` reads it;
    among several, exactly one must be a `kind` (or have no `kind`), else the file is refused as
    ambiguous or as holding none."""
    if len(docs) <= 1:
        return single_object(docs, what, where, kind)
    found = [i for i, d in enumerate(docs) if isinstance(d, dict) and d.get("kind", kind) == kind]
    if len(found) == 1:
        return docs[found[0]]
    many = f"holds {len(docs)} YAML documents"
    if not found:
        kinds = ", ".join(str(d.get("kind")) if isinstance(d, dict) else _kind_of(d) for d in docs)
        raise InputError(what, where, f"{many} ({kinds}) and no {kind}")
    listed = ", ".join(str(i + 1) for i in found)
    raise InputError(what, where, f"{many}: expected one {kind}, found {len(found)} (documents {listed})")


def load_object(path: str | os.PathLike[str], what: str, kind: str | None = None) -> dict[str, Any]:
    """Read a file that must hold one object (of `kind`)."""
    return single_object(load_documents(path, what), what, str(path), kind)


def _kind_of(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )
