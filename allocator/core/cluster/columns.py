"""Filter verdicts and fine scores of one request shape for every node, as numpy columns.

A column holds one entry per node slot of the cluster's `NodeTable` and remembers the table's
clock at its last refresh; a refresh forgets the entries of the slots that changed since (one
vectorised comparison), and entries are computed only when asked for. So the next pod of a shape
costs O(changed nodes) of Python plus O(nodes) of numpy, and a shape never seen before is decided
once per group of nodes in the same state (`allocate.fits_grouping`, `NodeScorer.fine_grouped`).

`FilterVerdicts` is a filter answer split the way kube-scheduler's extender reply wants it, built
from the codes without a per-node Python loop.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress

import numpy as np

from allocator.core.devices.allocate import fits, fits_grouping
from allocator.core.node.table import NodeTable
from allocator.core.reasons import Rejection
from allocator.core.request.pod_request import PodRequest

PASS, UNKNOWN = 0, 1  # codes every verdict column shares; rejections follow
_NOT_DECIDED = -1
_GROUP_MEMO = 50_000


class VerdictColumn:
    """`fits` of one request per node slot, as codes into `rejections`. The entry after the last
    slot always holds UNKNOWN, so slot -1 (a name not in the cluster) reads as unknown."""

    def __init__(self, req: PodRequest) -> None:
        self.req = req
        self.grouping = fits_grouping(req)
        self.codes = np.zeros(0, np.int32)
        self.synced = -1
        self.rejections: list[Rejection | None] = [None, None]
        self._code_of: dict[Rejection, int] = {}
        self._by_group: dict[int, int] = {}
        self._generation = -1
        self._tables: tuple[int, np.ndarray, np.ndarray, np.ndarray] | None = None

    def codes_for(self, table: NodeTable, slots: np.ndarray) -> np.ndarray:
        """The code of each slot (int32, aligned with `slots`; -1 slots read UNKNOWN)."""
        self._refresh(table)
        got = self.codes[slots]
        missing = got == _NOT_DECIDED
        if missing.any():
            self._decide(table, np.unique(slots[missing]))
            got = self.codes[slots]
        return got

    def _refresh(self, table: NodeTable) -> None:
        self.codes, self.synced = refreshed_codes(self.codes, self.synced, table)

    def _decide(self, table: NodeTable, slots: np.ndarray) -> None:
        states, req = table.states, self.req
        if self.grouping is None:  # the verdict reads no node: the first one answers for all
            code = self._by_group.get(-1)
            if code is None:
                code = self._by_group[-1] = self._code(fits(states[int(slots[0])], req))  # type: ignore[arg-type]
            self.codes[slots] = code
            return
        keys = table.feature(self.grouping)[slots]
        generation = table.generation(self.grouping)
        if generation != self._generation or len(self._by_group) > _GROUP_MEMO:
            self._by_group, self._generation = {}, generation
        memo = self._by_group
        if len(slots) == 1:  # the usual case after a placement: np.unique's grouping costs more
            key, slot = int(keys[0]), int(slots[0])
            code = memo.get(key)
            if code is None:
                code = memo[key] = self._code(fits(states[slot], req))  # type: ignore[arg-type]
            self.codes[slot] = code
            return
        groups, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        codes = np.empty(len(groups), np.int32)
        for i, (key, slot) in enumerate(zip(groups.tolist(), slots[first].tolist(), strict=True)):
            code = memo.get(key)
            if code is None:
                code = memo[key] = self._code(fits(states[slot], req))  # type: ignore[arg-type]
            codes[i] = code
        self.codes[slots] = codes[inverse.reshape(-1)]

    def _code(self, verdict: Rejection | None) -> int:
        if verdict is None:
            return PASS
        code = self._code_of.get(verdict)
        if code is None:
            code = self._code_of[verdict] = len(self.rejections)
            self.rejections.append(verdict)
        return code

    def arrays(self, unknown: Rejection) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per code: the rejection, its message, whether it is unresolvable (object, object,
        bool arrays; PASS holds None), with `unknown` for UNKNOWN."""
        n = len(self.rejections)
        cached = self._tables
        if cached is None or cached[0] != n:
            objects = np.empty(n, object)
            messages = np.empty(n, object)
            unresolvable = np.zeros(n, bool)
            for code, rej in enumerate(self.rejections):
                if rej is not None:
                    objects[code], messages[code], unresolvable[code] = rej, rej.message, rej.unresolvable
            cached = self._tables = (n, objects, messages, unresolvable)
        _, objects, messages, unresolvable = cached
        objects, messages, unresolvable = objects.copy(), messages.copy(), unresolvable.copy()
        objects[UNKNOWN], messages[UNKNOWN], unresolvable[UNKNOWN] = (
            unknown,
            unknown.message,
            unknown.unresolvable,
        )
        return objects, messages, unresolvable


def refreshed_codes(codes: np.ndarray, synced: int, table: NodeTable) -> tuple[np.ndarray, int]:
    """A code column (one per slot, then UNKNOWN for slot -1) sized to `table`, its dtype kept, with
    the slots changed since `synced` undecided again; and the table's clock it is now synced to."""
    size = len(table.stamp) + 1
    if len(codes) != size:
        grown = np.full(size, _NOT_DECIDED, codes.dtype)
        keep = min(len(codes), size) - 1
        if keep > 0:
            grown[:keep] = codes[:keep]
        grown[-1] = UNKNOWN
        codes = grown
    if synced != table.clock:
        if synced >= 0:
            codes[table.changed_since(synced)] = _NOT_DECIDED
        synced = table.clock
    return codes, synced


@dataclass
class FilterVerdicts:
    """A filter answer as the extender replies it: the names that passed (in the order asked,
    repeats kept), the message of every other name by whether preemption could cure it, and how
    many distinct names each rejection code rejected."""

    passed: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    codes: Counter[str] = field(default_factory=Counter)

    @classmethod
    def from_rejections(cls, passed: list[str], rejections: Mapping[str, Rejection]) -> FilterVerdicts:
        """From `ClusterState.feasible`'s answer shape (any source of per-node rejections)."""
        out = cls(passed)
        for name, rej in rejections.items():
            (out.unresolvable if rej.unresolvable else out.failed)[name] = rej.message
        out.codes = Counter(rej.code for rej in rejections.values())
        return out

    def replace(self, name: str, old: Rejection, new: Rejection) -> None:
        """Give a rejected name another reason (e.g. the service's own view of its Device)."""
        self.failed.pop(name, None)
        self.unresolvable.pop(name, None)
        (self.unresolvable if new.unresolvable else self.failed)[name] = new.message
        self.codes[old.code] -= 1
        if not self.codes[old.code]:
            del self.codes[old.code]
        self.codes[new.code] += 1


def rejection_map(
    names: Sequence[str], codes: np.ndarray, rejected: np.ndarray, objects: np.ndarray
) -> dict[str, Rejection]:
    """Each rejected name with its rejection, in the order asked (a repeated name once)."""
    return dict(zip(compress(names, rejected.tolist()), objects[codes[rejected]].tolist(), strict=True))


def verdicts_of(
    names: Sequence[str], codes: np.ndarray, column: VerdictColumn, unknown: Rejection
) -> FilterVerdicts:
    """The codes of `names` as a `FilterVerdicts`: dicts built by zip from per-code messages."""
    rejected = codes != PASS
    if not rejected.any():  # the usual answer: every node passes (a copy, no per-name mask)
        return FilterVerdicts(list(names))
    out = FilterVerdicts(list(compress(names, (~rejected).tolist())))
    objects, messages, unresolvable = column.arrays(unknown)
    hard = unresolvable[codes] & rejected
    soft = rejected & ~hard
    if soft.any():
        out.failed = dict(zip(compress(names, soft.tolist()), messages[codes[soft]].tolist(), strict=True))
    if hard.any():
        out.unresolvable = dict(
            zip(compress(names, hard.tolist()), messages[codes[hard]].tolist(), strict=True)
        )
    if len(out.failed) + len(out.unresolvable) == int(rejected.sum()):
        counts = np.bincount(codes[rejected], minlength=len(objects)).tolist()
        for code, count in enumerate(counts):
            if count:
                out.codes[objects[code].code] += count
    else:  # a name asked twice counts once, as in a dict keyed by name
        seen: dict[str, int] = dict(
            zip(compress(names, rejected.tolist()), codes[rejected].tolist(), strict=True)
        )
        out.codes = Counter(objects[code].code for code in seen.values())
    return out


class ScoreColumn:
    """Fine scores (0..100) of one request shape under one scorer state, per node slot."""

    def __init__(self) -> None:
        self.values = np.zeros(0, np.float64)
        self.known = np.zeros(0, bool)
        self.synced = -1

    def refresh(self, table: NodeTable) -> None:
        size = len(table.stamp)
        if len(self.values) != size:
            values, known = np.zeros(size, np.float64), np.zeros(size, bool)
            keep = min(len(self.values), size)
            values[:keep], known[:keep] = self.values[:keep], self.known[:keep]
            self.values, self.known = values, known
        if self.synced != table.clock:
            if self.synced >= 0:
                self.known[table.changed_since(self.synced)] = False
            self.synced = table.clock
