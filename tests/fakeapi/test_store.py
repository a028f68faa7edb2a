"""The store's history and a watcher's flow control, below the HTTP layer."""

from __future__ import annotations

import pytest

from tests.support.fakeapi.builtin import builtin_registry
from tests.support.fakeapi.operations import Operations
from tests.support.fakeapi.reads import ListQuery
from tests.support.fakeapi.store import Store, TooOld
from tests.support.fakeapi.watch import END_OVERFLOW, Watcher, WatchSettings


def _obj(name: str, value: str = "1") -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {"v": value}}


def test_resource_versions_are_global_and_monotonic() -> None:
    store = Store()
    a = store.add("nodes", _obj("a"))
    b = store.add("pods", {**_obj("b"), "metadata": {"name": "b", "namespace": "default"}})
    a2 = store.replace("nodes", _obj("a", "2"))
    gone = store.remove("nodes", "", "a")
    assert [x["metadata"]["resourceVersion"] for x in (a, b, a2, gone)] == ["1", "2", "3", "4"]
    assert gone["spec"] == {"v": "2"}
    assert store.rv == 4


def test_snapshots_and_history_bounds() -> None:
    store = Store(history_limit=3)
    store.add("nodes", _obj("a"))  # rv 1
    store.replace("nodes", _obj("a", "2"))  # rv 2
    store.add("nodes", _obj("b"))  # rv 3
    store.remove("nodes", "", "a")  # rv 4: rv 1 leaves the history
    assert [o["spec"]["v"] for o in store.snapshot_at("nodes", 2)] == ["2"]
    assert [o["metadata"]["name"] for o in store.snapshot_at("nodes", 3)] == ["a", "b"]
    assert [c.type for c in store.changes_since("nodes", 1)] == ["MODIFIED", "ADDED", "DELETED"]
    with pytest.raises(TooOld) as err:
        store.changes_since("nodes", 0)
    assert (err.value.requested, err.value.oldest) == (0, 1)
    store.compact()
    assert store.changes_since("nodes", 4) == []
    with pytest.raises(TooOld):
        store.snapshot_at("nodes", 3)


def test_a_watcher_that_falls_behind_is_dropped() -> None:
    """Like the apiserver, the fake stops a watch whose client does not keep up."""
    types = builtin_registry()
    ops = Operations(types, Store(), require_namespaces=False)
    watcher = Watcher(
        ops, types.resolve("nodes"), "", ListQuery(), bookmarks=False, settings=WatchSettings(queue_limit=3)
    )
    watcher.begin("0")
    for i in range(5):
        ops.store.add("nodes", _obj(f"n{i}"))
    items = [watcher.queue.get_nowait() for _ in range(watcher.queue.qsize())]
    assert [i[0] for i in items[:4]] == ["ADDED"] * 4
    assert getattr(items[-1], "reason", None) == END_OVERFLOW
    watcher.close()
