"""Strategic merge patch (`application/strategic-merge-patch+json`) for the built-in kinds.

Maps merge like a JSON merge patch (null deletes a key). Lists named in the kind's schema merge by their
merge key (containers by `name`, conditions by `type`, ...); lists of primitives marked mergeable
(`metadata.finalizers`) merge as sets; every other list is replaced. The directives `$patch`
(replace/delete/merge), `$retainKeys`, `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>`
are honoured.

Order of a merged list, as the apiserver produces it: patch items keep the patch's order, items only on
the server keep theirs, and the two runs interleave by server position where both items have one; an item
new to the server goes before a server-only item (so a new scheduling gate lands at index 0, as recorded).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# A schema maps a field name to a nested schema (a map field) or a MergeList (a mergeable list).
Schema = Mapping[str, Any]

PATCH = "$patch"
RETAIN_KEYS = "$retainKeys"
DELETE_FROM_PRIMITIVE = "$deleteFromPrimitiveList/"
SET_ELEMENT_ORDER = "$setElementOrder/"


class StrategicPatchError(ValueError):
    """The patch is malformed for the schema (the apiserver answers 400 or 422)."""


@dataclass(frozen=True)
class MergeList:
    """A list merged item by item: by `key` for lists of maps, by value when `key` is None."""

    key: str | None
    item: Schema = field(default_factory=dict)


def apply(original: Any, patch: Any, schema: Schema) -> Any:
    if not isinstance(patch, dict):
        raise StrategicPatchError("strategic merge patch body must be a JSON object")
    merged = _merge_map(original if isinstance(original, dict) else {}, patch, schema)
    return {} if merged is None else merged


def _merge_map(original: dict[str, Any], patch: dict[str, Any], schema: Schema) -> dict[str, Any] | None:
    directive = patch.get(PATCH)
    if directive == "delete":
        return None
    if directive == "replace":
        return _strip({k: v for k, v in patch.items() if k != PATCH}, schema)
    if directive not in (None, "merge"):
        raise StrategicPatchError(f"unknown patch type: {directive}")

    result = copy.deepcopy(original)
    orders: dict[str, list[Any]] = {}
    for name, value in patch.items():
        if name in (PATCH, RETAIN_KEYS):
            continue
        if name.startswith(SET_ELEMENT_ORDER):
            orders[name[len(SET_ELEMENT_ORDER) :]] = value
            continue
        if name.startswith(DELETE_FROM_PRIMITIVE):
            target = name[len(DELETE_FROM_PRIMITIVE) :]
            if isinstance(result.get(target), list):
                result[target] = [v for v in result[target] if v not in value]
            continue
        if value is None:
            result.pop(name, None)
            continue
        merged = _merge_value(result.get(name), value, schema.get(name))
        if merged is None:
            result.pop(name, None)
        else:
            result[name] = merged

    for name, order in orders.items():
        sub = schema.get(name)
        if isinstance(result.get(name), list) and isinstance(sub, MergeList):
            result[name] = _apply_element_order(result[name], order, sub.key)
    if RETAIN_KEYS in patch:
        keep = set(patch[RETAIN_KEYS])
        result = {k: v for k, v in result.items() if k in keep}
    return result


def _merge_value(current: Any, value: Any, sub: Any) -> Any:
    if isinstance(value, dict):
        nested = sub if isinstance(sub, Mapping) else {}
        return _merge_map(current if isinstance(current, dict) else {}, value, nested)
    if isinstance(value, list) and isinstance(sub, MergeList):
        return _merge_list(current if isinstance(current, list) else [], value, sub)
    return copy.deepcopy(value)


def _merge_list(original: list[Any], patch: list[Any], spec: MergeList) -> list[Any]:
    if spec.key is None:
        return _merge_primitives(original, patch)
    key = spec.key
    if any(isinstance(p, dict) and p.get(PATCH) == "replace" for p in patch):
        kept = [p for p in patch if not (isinstance(p, dict) and p.get(PATCH) == "replace")]
        return [_strip(p, spec.item) for p in kept]

    deleted: set[Any] = set()
    merged_patch: list[Any] = []
    patched_keys: set[Any] = set()
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise StrategicPatchError(f"map: {item} does not contain declared merge key: {key}")
        if item.get(PATCH) == "delete":
            deleted.add(_hashable(item[key]))
            continue
        current = next((o for o in original if isinstance(o, dict) and o.get(key) == item[key]), {})
        merged = _merge_map(current, item, spec.item)
        if merged is not None:
            merged_patch.append(merged)
            patched_keys.add(_hashable(item[key]))
    server_only = [
        o
        for o in original
        if _hashable(o.get(key) if isinstance(o, dict) else o) not in patched_keys | deleted
    ]
    positions = {_hashable(o.get(key)): i for i, o in enumerate(original) if isinstance(o, dict)}
    return _interleave(server_only, merged_patch, lambda item: positions.get(_hashable(item.get(key))))


def _merge_primitives(original: list[Any], patch: list[Any]) -> list[Any]:
    added: list[Any] = []
    for value in patch:
        if value not in added:
            added.append(value)
    server_only = [v for v in original if v not in added]
    positions = {_hashable(v): i for i, v in enumerate(original)}
    return _interleave(server_only, added, lambda v: positions.get(_hashable(v)))


def _interleave(
    server_only: list[Any], patched: list[Any], position: Callable[[Any], int | None]
) -> list[Any]:
    """Merge the two ordered runs; a server item goes first only if both have a server position and it
    comes earlier there."""
    out: list[Any] = []
    i = j = 0
    while i < len(server_only) or j < len(patched):
        if j >= len(patched):
            out.append(server_only[i])
            i += 1
            continue
        if i >= len(server_only):
            out.append(patched[j])
            j += 1
            continue
        left, right = position(server_only[i]), position(patched[j])
        if left is not None and right is not None and left < right:
            out.append(server_only[i])
            i += 1
        else:
            out.append(patched[j])
            j += 1
    return out


def _apply_element_order(items: list[Any], order: list[Any], key: str | None) -> list[Any]:
    def ident(item: Any) -> Any:
        return _hashable(item.get(key) if key is not None and isinstance(item, dict) else item)

    wanted = [ident(o) for o in order]
    by_id = {ident(item): item for item in items}
    unordered = [item for item in items if ident(item) not in wanted]
    ordered = [by_id[w] for w in wanted if w in by_id]
    return unordered + ordered


def _strip(value: Any, schema: Schema) -> Any:
    """A new value from a patch with its directives removed."""
    if isinstance(value, dict):
        merged = _merge_map({}, value, schema)
        return {} if merged is None else merged
    return copy.deepcopy(value)


def _hashable(value: Any) -> Any:
    if isinstance(value, dict | list):
        return repr(value)
    return value
