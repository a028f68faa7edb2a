"""Node slots for column caches: a numpy index per node, a change clock, and node summaries as columns.

Every node of a `ClusterState` has a slot (an index into numpy arrays). Each change to a node
(`NodeState._changed`) stamps its slot with a cluster-wide clock, so a cache that remembers the
clock of its last refresh finds the nodes that changed since with one vectorised comparison.

Features are request-independent node summaries (the GPU model, the per-GPU free share, the
inventory class and usage, ...) kept as int64 columns: hashable values are interned to small
ids, so nodes in the same state share an id and a request shape can be decided once per id
instead of once per node. A feature is re-read only for the slots whose stamp is newer than the
feature's own refresh. Ids are never reused: when an intern table grows past its bound it starts
a new generation, and caches keyed by ids (`generation`) start over. Rows (`rows`) are the same
for per-node int tuples, kept as the rows of a 2-D column.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from allocator.core.node.features import Feature, Rows
    from allocator.core.node.state import NodeState

Extract = Callable[["NodeState"], Any]
_RAW_LIMIT = 2**62  # raw int features are clamped into int64 (see `feature`)
_RECENT_LISTS = 8
_LOG_LIMIT = 1 << 16


class _Feature:
    __slots__ = ("by_id", "extract", "generation", "ids", "raw", "synced", "values")

    def __init__(self, extract: Extract, raw: bool) -> None:
        self.extract = extract
        self.raw = raw
        self.values = np.zeros(0, np.int64)
        self.synced = -1  # clock of the last refresh; -1: never
        self.ids: dict[Hashable, int] = {}
        self.by_id: list[Any] = []
        self.generation = 0


class _Rows:
    __slots__ = ("extract", "pad", "synced", "values")

    def __init__(self, spec: Rows) -> None:
        self.extract = spec.extract
        self.pad = spec.pad
        self.values = np.full((0, 1), spec.pad, np.int64)
        self.synced = -1


class _Total:
    """Per-slot (group id, value) last counted, and the running sum and node count per group."""

    __slots__ = ("counts", "generation", "group", "result", "sums", "synced", "value")

    def __init__(self) -> None:
        self.synced = -1
        self.generation = -1
        self.result: dict[Any, int] = {}
        self.reset(0)

    def reset(self, generation: int) -> None:
        self.generation = generation
        self.group = np.full(len(getattr(self, "group", ())), -1, np.int64)
        self.value = np.zeros(len(self.group), np.int64)
        self.sums = np.zeros(0, np.int64)
        self.counts = np.zeros(0, np.int64)

    def grow(self, size: int) -> None:
        extra = size - len(self.group)
        self.group = np.concatenate([self.group, np.full(extra, -1, np.int64)])
        self.value = np.concatenate([self.value, np.zeros(extra, np.int64)])


class NodeTable:
    """Slots, stamps and feature columns for the nodes of one cluster. `tie` gives a node's stable
    tie key (kept per slot as uint64 for vectorised ranking)."""

    def __init__(self, tie: Callable[[str], int]) -> None:
        self.tie = tie
        self.slots: dict[str, int] = {}  # node name -> slot
        self.states: list[NodeState | None] = []  # slot -> its node (None: free slot)
        self.names: list[str] = []  # slot -> node name ("" when free)
        self.stamp = np.zeros(0, np.int64)  # slot -> clock of its last change
        self.ties = np.zeros(0, np.uint64)
        self.clock = 0
        self.layout = 0  # bumps when slots are assigned or freed
        self._free: list[int] = []
        self._features: dict[str, _Feature] = {}
        self._rows: dict[str, _Rows] = {}
        self._totals: dict[tuple[str, str], _Total] = {}
        self._recent: list[tuple[list[str], np.ndarray]] = []
        # Slots in the order they were touched since clock `_log_start` (the i-th at clock
        # `_log_start + i + 1`): the few nodes changed since a recent clock, without a scan.
        self._log: list[int] = []
        self._log_start = 0

    @property
    def capacity(self) -> int:
        return len(self.states)

    # -- membership ------------------------------------------------------------------------------
    def attach(self, state: NodeState) -> int:
        """Give `state` a slot (its name must not have one) and hook it to the clock."""
        if self._free:
            slot = self._free.pop()
        else:
            slot = len(self.states)
            self.states.append(None)
            self.names.append("")
            if slot >= len(self.stamp):
                grow = max(64, 2 * len(self.stamp))
                self.stamp = np.concatenate([self.stamp, np.zeros(grow - len(self.stamp), np.int64)])
                self.ties = np.concatenate([self.ties, np.zeros(grow - len(self.ties), np.uint64)])
        self.states[slot] = state
        self.names[slot] = state.name
        self.slots[state.name] = slot
        self.ties[slot] = self.tie(state.name)
        state.attach(self, slot)
        self.layout += 1
        self._recent.clear()
        self.touch(slot)
        return slot

    def detach(self, name: str) -> None:
        slot = self.slots.pop(name, None)
        if slot is None:
            return
        state = self.states[slot]
        if state is not None:
            state.attach(None, -1)
        self.states[slot] = None
        self.names[slot] = ""
        self._free.append(slot)
        self.layout += 1
        self._recent.clear()
        self.touch(slot)

    def touch(self, slot: int) -> None:
        """The node in `slot` changed (called by `NodeState._changed`)."""
        self.clock += 1
        self.stamp[slot] = self.clock
        log = self._log
        log.append(slot)
        if len(log) > _LOG_LIMIT:
            self._log, self._log_start = [], self.clock

    def changed_since(self, clock: int) -> np.ndarray:
        """Slots whose node changed (or was attached or detached) after `clock`, ascending."""
        recent = self._recent_changes(clock)
        if recent is not None:
            return np.array(recent, np.intp)
        return np.flatnonzero(self.stamp[: len(self.states)] > clock)

    def changed_list(self, clock: int) -> list[int]:
        """`changed_since` as a list, every slot for a negative clock (never read): for loops
        that re-read the changed nodes."""
        if clock < 0:
            return list(range(len(self.states)))
        recent = self._recent_changes(clock)
        if recent is not None:
            return recent
        return np.flatnonzero(self.stamp[: len(self.states)] > clock).tolist()

    def _recent_changes(self, clock: int) -> list[int] | None:
        """The slots changed after `clock` from the log, when it reaches back that far and they
        are few (None: scan the stamps instead)."""
        if clock < self._log_start:
            return None
        recent = self._log[clock - self._log_start :]
        return sorted(set(recent)) if 8 * len(recent) < len(self.states) else None

    # -- names -----------------------------------------------------------------------------------
    def slots_of(self, names: Sequence[str]) -> np.ndarray:
        """The slot of each name (-1 for names not in the cluster), as an intp array.

        kube-scheduler sends the same node list to filter again and again, and prioritize the list
        filter passed: recent lists are remembered and recognised by equality (a memcmp per name,
        cheaper than hashing freshly decoded strings)."""
        n = len(names)
        for i, (known, slots) in enumerate(self._recent):
            if len(known) == n and known == names:
                if i:
                    self._recent.insert(0, self._recent.pop(i))
                return slots
        get = self.slots.get
        slots = np.fromiter(map(get, names, repeat(-1)), np.intp, n)
        self.remember(names, slots)
        return slots

    def remember(self, names: Sequence[str], slots: np.ndarray) -> None:
        """Recognise `names` (with these slots) next time; the list is copied."""
        self._recent.insert(0, (list(names), slots))
        del self._recent[_RECENT_LISTS:]

    # -- features --------------------------------------------------------------------------------
    def feature(self, spec: Feature) -> np.ndarray:
        """The feature's column over all slots (free slots hold -1), re-read where stale: ids of
        interned values, or with `spec.raw` the int itself clamped to ±2**62."""
        f = self._features.get(spec.name)
        if f is None:
            f = self._features[spec.name] = _Feature(spec.extract, spec.raw)
        if f.synced == self.clock:
            return f.values
        n = len(self.states)
        if len(f.values) < len(self.stamp):
            grown = np.full(len(self.stamp), -1, np.int64)
            grown[: len(f.values)] = f.values
            f.values = grown
        dirty = self.changed_list(f.synced)
        if f.raw:
            self._read_raw(f, dirty)
        else:
            if len(f.ids) > 4 * len(self.slots) + 10_000:
                f.ids, f.by_id = {}, []
                f.generation += 1
                dirty = list(range(n))
            self._read_interned(f, dirty)
        f.synced = self.clock
        return f.values

    def rows(self, spec: Rows) -> np.ndarray:
        """The rows' 2-D int64 column over all slots (free slots and the tails of short rows hold
        `spec.pad`; at least one wide), re-read where stale."""
        r = self._rows.get(spec.name)
        if r is None:
            r = self._rows[spec.name] = _Rows(spec)
        if r.synced == self.clock:
            return r.values
        if len(r.values) < len(self.stamp):
            grown = np.full((len(self.stamp), r.values.shape[1]), r.pad, np.int64)
            grown[: len(r.values)] = r.values
            r.values = grown
        states, extract, pad = self.states, r.extract, r.pad
        for slot in self.changed_list(r.synced):
            state = states[slot]
            row = () if state is None else extract(state)
            if len(row) > r.values.shape[1]:
                wider = np.full((len(r.values), len(row)), pad, np.int64)
                wider[:, : r.values.shape[1]] = r.values
                r.values = wider
            values = r.values[slot]
            values[: len(row)] = row
            values[len(row) :] = pad
        r.synced = self.clock
        return r.values

    def totals(self, group: Feature, value: Feature) -> dict[Any, int]:
        """The sum of the raw feature `value` over the nodes of each value of the interned feature
        `group` (groups whose nodes are all gone are left out). Kept incrementally: each call
        re-reads only the slots changed since the last one."""
        t = self._totals.get((group.name, value.name))
        if t is None:
            t = self._totals[(group.name, value.name)] = _Total()
        if t.synced == self.clock:
            return t.result
        groups, values = self.feature(group), self.feature(value)
        generation = self.generation(group)
        if t.synced < 0 or generation != t.generation:
            t.reset(generation)
            dirty = np.arange(len(self.states))
        else:
            dirty = self.changed_since(t.synced)
        if len(t.group) < len(self.stamp):
            t.grow(len(self.stamp))
        if len(dirty):
            old_g, old_v = t.group[dirty], t.value[dirty]
            live = old_g >= 0
            np.subtract.at(t.sums, old_g[live], old_v[live])
            np.subtract.at(t.counts, old_g[live], 1)
            new_g, new_v = groups[dirty], np.where(groups[dirty] >= 0, values[dirty], 0)
            size = int(new_g.max()) + 1
            if size > len(t.sums):
                t.sums = np.concatenate([t.sums, np.zeros(size - len(t.sums), np.int64)])
                t.counts = np.concatenate([t.counts, np.zeros(size - len(t.counts), np.int64)])
            live = new_g >= 0
            np.add.at(t.sums, new_g[live], new_v[live])
            np.add.at(t.counts, new_g[live], 1)
            t.group[dirty], t.value[dirty] = new_g, new_v
        by_id = self._features[group.name].by_id
        present = np.flatnonzero(t.counts > 0).tolist()
        t.result = dict(zip((by_id[i] for i in present), t.sums[present].tolist(), strict=True))
        t.synced = self.clock
        return t.result

    def value(self, spec: Feature, ident: int) -> Any:
        """The value an interned feature id stands for."""
        return self._features[spec.name].by_id[ident]

    def generation(self, spec: Feature) -> int:
        """Changes when the feature's ids start over (caches keyed by its ids must, too)."""
        f = self._features.get(spec.name)
        return 0 if f is None else f.generation

    def _read_raw(self, f: _Feature, slots: list[int]) -> None:
        states, values, extract = self.states, f.values, f.extract
        for slot in slots:
            state = states[slot]
            if state is None:
                values[slot] = -1
                continue
            v = extract(state)
            values[slot] = max(-_RAW_LIMIT, min(_RAW_LIMIT, v))

    def _read_interned(self, f: _Feature, slots: list[int]) -> None:
        states, values, extract, ids, by_id = self.states, f.values, f.extract, f.ids, f.by_id
        for slot in slots:
            state = states[slot]
            if state is None:
                values[slot] = -1
                continue
            v = extract(state)
            ident = ids.get(v)
            if ident is None:
                ident = ids[v] = len(by_id)
                by_id.append(v)
            values[slot] = ident


def combine_keys(columns: Sequence[np.ndarray]) -> np.ndarray:
    """One non-negative int64 key per row such that rows are equal in every column exactly when
    their keys are equal (columns hold non-negative ints)."""
    out = columns[0].astype(np.int64, copy=True)
    if not len(out):
        return out
    span = int(out.max()) + 1
    for col in columns[1:]:
        width = int(col.max()) + 1
        if span * width >= _RAW_LIMIT:
            _, dense = np.unique(out, return_inverse=True)
            out, span = dense.astype(np.int64).reshape(-1), int(dense.max()) + 1
            if span * width >= _RAW_LIMIT:
                _, dense_col = np.unique(col, return_inverse=True)
                col, width = dense_col.reshape(-1), int(dense_col.max()) + 1
        out = out * width + col
        span *= width
    return out
