"""`NodeTable.changed_since` (from its change log or the stamps) and `NodeTable.rows` (a per-node
tuple as a row of a 2-D column, re-read only where nodes changed)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from allocator.core.cluster.state import ClusterState
from allocator.core.node import table as node_table
from allocator.core.node.features import Rows
from allocator.core.node.gpu_features import FREE_PCT_ROWS
from apis.annotations import DeviceAllocations
from tests.support.allocations import entry
from tests.support.machines import dgx_h100_device, l40s_device

CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"


def _node(name: str) -> dict:
    return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": "8", "memory": "8Gi"}}}


def test_rows_pad_widen_and_follow_changes() -> None:
    c = ClusterState()
    c.upsert_node(_node("cpu"))
    rows = c.table.rows(FREE_PCT_ROWS)
    assert rows.shape[1] == 1 and rows[0].tolist() == [-1]  # no GPUs: padding only
    c.set_device(l40s_device("l40s"))
    c.assign("ns/a", "l40s", DeviceAllocations({"gpu": [entry(3, {CORE: 30, RATIO: 30})]}))
    rows = c.table.rows(FREE_PCT_ROWS)
    slot = c.table.slots["l40s"]
    assert rows[slot].tolist() == [100, 100, 100, 70, 100, 100, 100, 100]
    assert rows[c.table.slots["cpu"]].tolist() == [-1] * 8  # widened with the padding
    c.unassign("ns/a")
    assert c.table.rows(FREE_PCT_ROWS)[slot].tolist() == [100] * 8
    c.remove_node("l40s")
    assert c.table.rows(FREE_PCT_ROWS)[slot].tolist() == [-1] * 8  # a free slot
    c.set_device(dgx_h100_device("again"))  # takes the freed slot
    assert c.table.rows(FREE_PCT_ROWS)[c.table.slots["again"]].tolist() == [100] * 8


def test_rows_read_only_the_changed_nodes() -> None:
    reads: list[str] = []

    def lengths(state) -> tuple[int, ...]:
        reads.append(state.name)
        return (len(state.pods),)

    spec = Rows("pods", lengths, pad=0)
    c = ClusterState()
    for name in ("a", "b", "c"):
        c.upsert_node(_node(name))
    assert c.table.rows(spec)[:3].tolist() == [[0], [0], [0]]
    reads.clear()
    c.assign("ns/x", "b", None, 100)
    assert c.table.rows(spec)[:3].tolist() == [[0], [1], [0]] and reads == ["b"]
    assert c.table.rows(spec) is c.table.rows(spec) and reads == ["b"]  # nothing changed since


@pytest.mark.parametrize("log_limit", [3, 1 << 16])
def test_changed_since_equals_the_stamps(monkeypatch: pytest.MonkeyPatch, log_limit: int) -> None:
    monkeypatch.setattr(node_table, "_LOG_LIMIT", log_limit)  # 3: the log restarts all the time
    rng = random.Random(5)
    c = ClusterState()
    for i in range(40):
        c.upsert_node(_node(f"n{i}"))
    t = c.table
    for step in range(300):
        name = f"n{rng.randrange(45)}"
        if name in c.nodes and rng.random() < 0.05:
            c.remove_node(name)
        elif name not in c.nodes:
            c.upsert_node(_node(name))
        else:
            c.assign(f"ns/p{step}", name, None, rng.randrange(1, 100))
        for since in {-1, 0, t.clock, t.clock - 1, t.clock - rng.randrange(1, 12), rng.randrange(t.clock)}:
            want = np.flatnonzero(t.stamp[: len(t.states)] > since).tolist()
            assert t.changed_since(since).tolist() == want, (step, since)
            assert t.changed_list(since) == (list(range(len(t.states))) if since < 0 else want)
