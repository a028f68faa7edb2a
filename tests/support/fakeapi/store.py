"""Object storage with one global resourceVersion and a bounded history of changes (the "etcd" part).

Stored objects are never mutated: every write stores a fresh dict, so an object handed to a watcher or
kept in the history stays as it was when written.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .objects import canonical_metadata

JsonObj = dict[str, Any]
ObjectKey = tuple[str, str]  # (namespace, name); namespace is "" for cluster-scoped objects


@dataclass(frozen=True)
class Change:
    """One write, as a watcher sees it before filtering."""

    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    storage: str  # resource storage key (`pods`, `devices.scheduling.koordinator.sh`)
    obj: JsonObj  # the state after the write; for DELETED the last state, stamped with the deletion RV
    prev: JsonObj | None  # the state before the write (None for ADDED)


class TooOld(Exception):
    """The asked-for resourceVersion is older than the retained history."""

    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"resourceVersion {requested} is older than the history (oldest usable {oldest})")
        self.requested = requested
        self.oldest = oldest


def object_key(obj: JsonObj) -> ObjectKey:
    meta = obj.get("metadata", {})
    return (meta.get("namespace") or "", meta["name"])


def with_resource_version(obj: JsonObj, rv: int) -> JsonObj:
    return {**obj, "metadata": canonical_metadata({**obj.get("metadata", {}), "resourceVersion": str(rv)})}


class Store:
    def __init__(self, history_limit: int = 10_000) -> None:
        if history_limit < 1:
            raise ValueError("history_limit must be at least 1")
        self.rv = 0
        # Every change with rv > floor is still in the history; resuming from floor or later works.
        self.floor = 0
        self._history_limit = history_limit
        self._objects: dict[str, dict[ObjectKey, JsonObj]] = {}
        self._history: deque[Change] = deque()
        self._listeners: list[Callable[[Change], None]] = []

    # -- reads ---------------------------------------------------------------------------------------
    def get(self, storage: str, namespace: str, name: str) -> JsonObj | None:
        return self._objects.get(storage, {}).get((namespace, name))

    def list(self, storage: str, namespace: str | None = None) -> list[JsonObj]:
        """Objects in (namespace, name) order; all namespaces when `namespace` is None."""
        bucket = self._objects.get(storage, {})
        return [bucket[k] for k in sorted(bucket) if namespace is None or k[0] == namespace]

    def count_in_namespace(self, namespace: str) -> int:
        return sum(1 for bucket in self._objects.values() for key in bucket if key[0] == namespace)

    def storages_with_namespace(self, namespace: str) -> list[str]:
        return [s for s, bucket in self._objects.items() if any(k[0] == namespace for k in bucket)]

    # -- writes --------------------------------------------------------------------------------------
    def add(self, storage: str, obj: JsonObj) -> JsonObj:
        key = object_key(obj)
        bucket = self._objects.setdefault(storage, {})
        if key in bucket:
            raise KeyError(f"{storage} {key} already exists")
        stored = with_resource_version(obj, self.rv + 1)
        bucket[key] = stored
        self._record("ADDED", storage, stored, None)
        return stored

    def replace(self, storage: str, obj: JsonObj) -> JsonObj:
        key = object_key(obj)
        bucket = self._objects.get(storage, {})
        prev = bucket[key]
        stored = with_resource_version(obj, self.rv + 1)
        bucket[key] = stored
        self._record("MODIFIED", storage, stored, prev)
        return stored

    def remove(self, storage: str, namespace: str, name: str) -> JsonObj:
        prev = self._objects[storage].pop((namespace, name))
        final = with_resource_version(prev, self.rv + 1)
        self._record("DELETED", storage, final, prev)
        return final

    def _record(self, type_: str, storage: str, obj: JsonObj, prev: JsonObj | None) -> None:
        self.rv += 1
        change = Change(self.rv, type_, storage, obj, prev)
        self._history.append(change)
        while len(self._history) > self._history_limit:
            self.floor = self._history.popleft().rv
        for listener in list(self._listeners):
            listener(change)

    # -- history -------------------------------------------------------------------------------------
    def changes_since(self, storage: str, rv: int) -> list[Change]:
        if rv < self.floor:
            raise TooOld(rv, self.floor)
        return [c for c in self._history if c.rv > rv and c.storage == storage]

    def snapshot_at(self, storage: str, rv: int) -> list[JsonObj]:
        """The objects of `storage` as they were at `rv`, rebuilt by undoing later changes."""
        if rv < self.floor:
            raise TooOld(rv, self.floor)
        state = dict(self._objects.get(storage, {}))
        for change in reversed(self._history):
            if change.rv <= rv:
                break
            if change.storage != storage:
                continue
            key = object_key(change.obj)
            if change.type == "ADDED":
                state.pop(key, None)
            else:
                assert change.prev is not None
                state[key] = change.prev
        return [state[k] for k in sorted(state)]

    def compact(self) -> None:
        """Forget the whole history: resuming from any earlier resourceVersion now fails with 410."""
        self._history.clear()
        self.floor = self.rv

    # -- notification --------------------------------------------------------------------------------
    def subscribe(self, listener: Callable[[Change], None]) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[Change], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)
