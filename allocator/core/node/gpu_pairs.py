"""Qualities of GPU sets over a node's interconnect matrix (`apis.interconnect`): a set's quality
is its bottleneck pair value, then the sum of its pair values; a packing's is its weakest set's
bottleneck, then its total. Shared by the GPU set chooser (devices/gpu_sets.py), which picks the
set, and by the topology score and the gang planner (scoring/topology.py), which rate a node by the
set the chooser would pick.

`tables(ic)` gives the matrix indexed by minor (`PairTable`, by `values`) and, where they break
some tie, the same by `pcie_values`; answers are remembered per table, and tables per matrix, so
nodes of one machine type share them. Exact for up to `EXACT_LIMIT` GPUs (every subset is a
bitmask), a bounded greedy search beyond.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from apis.interconnect import Interconnect

EXACT_LIMIT = 8  # free GPUs up to which every candidate set (and every packing) is enumerated
GREEDY_SEEDS = 16  # seeds of the bounded search beyond
CACHE_MAX = 20_000


def bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class PairTable:
    """One pair-value table of an Interconnect indexed by minor, with remembered set qualities
    and packings."""

    def __init__(self, minors: tuple[int, ...], values: tuple[tuple[int, ...], ...]) -> None:
        size = max(minors, default=-1) + 1
        self.value = [[0] * size for _ in range(size)]
        for i, a in enumerate(minors):
            for j, b in enumerate(minors):
                self.value[a][b] = values[i][j]
        self._quality: dict[int, tuple[int, int]] = {}
        self._packing: dict[tuple, tuple[int, int]] = {}

    def quality(self, mask: int) -> tuple[int, int]:
        hit = self._quality.get(mask)
        if hit is None:
            members = bits(mask)
            if len(members) < 2:
                hit = (0, 0)
            else:
                vals = [self.value[a][b] for a, b in combinations(members, 2)]
                hit = (min(vals), sum(vals))
            if len(self._quality) > CACHE_MAX:
                self._quality.clear()
            self._quality[mask] = hit
        return hit

    def packing(self, pool: int, size: int) -> tuple[int, int]:
        """Best (bottleneck, total) of |pool| // size disjoint `size`-sets from `pool`."""
        sets = pool.bit_count() // size
        if sets == 0:
            return (0, 0)
        if pool.bit_count() > EXACT_LIMIT:
            return self._greedy_packing(pool, size, sets)
        return self._pack(pool, sets, size)

    def _pack(self, pool: int, sets: int, size: int) -> tuple[int, int]:
        # (bottleneck, total) does not split into subproblems: a tail's best pair can be beaten by
        # a tail with a lower bottleneck and a higher total once the set before it is the weaker
        # one. So the bottleneck is settled first, then the total over the sets that keep it.
        key = (pool, sets, size)
        hit = self._packing.get(key)
        if hit is None:
            floor = self._bottleneck(pool, sets, size)
            hit = (floor, self._total(pool, sets, size, floor))
            if len(self._packing) > CACHE_MAX:
                self._packing.clear()
            self._packing[key] = hit
        return hit

    def _choices(self, pool: int, sets: int, size: int) -> tuple[bool, list[int]]:
        """Whether the lowest GPU may stay out of every set, and each set that takes it."""
        low = pool & -pool
        rest = pool ^ low
        taking = []
        for others in combinations(bits(rest), size - 1):
            chosen = low
            for m in others:
                chosen |= 1 << m
            taking.append(chosen)
        return rest.bit_count() >= sets * size, taking

    def _bottleneck(self, pool: int, sets: int, size: int) -> int:
        """The best weakest-set quality of `sets` disjoint sets from `pool`."""
        if sets == 0:
            return 1 << 62
        key = (pool, sets, size, None)
        hit = self._packing.get(key)
        if hit is not None:
            return hit[0]
        skip, taking = self._choices(pool, sets, size)
        best = self._bottleneck(pool & (pool - 1), sets, size) if skip else -1
        for chosen in taking:
            qmin = self.quality(chosen)[0]
            if qmin > best:
                best = max(best, min(qmin, self._bottleneck(pool & ~chosen, sets - 1, size)))
        self._packing[key] = (best, 0)
        return best

    def _total(self, pool: int, sets: int, size: int, floor: int) -> int:
        """The best total of `sets` disjoint sets from `pool` each at least `floor`; -1 if none."""
        if sets == 0:
            return 0
        key = (pool, sets, size, floor)
        hit = self._packing.get(key)
        if hit is not None:
            return hit[1]
        skip, taking = self._choices(pool, sets, size)
        best = self._total(pool & (pool - 1), sets, size, floor) if skip else -1
        for chosen in taking:
            qmin, qsum = self.quality(chosen)
            if qmin >= floor:
                tail = self._total(pool & ~chosen, sets - 1, size, floor)
                if tail >= 0:
                    best = max(best, qsum + tail)
        self._packing[key] = (floor, best)
        return best

    def _greedy_packing(self, pool: int, size: int, sets: int) -> tuple[int, int]:
        low, total = 1 << 62, 0
        for _ in range(sets):
            found = self.greedy_best(pool, size)
            if found is None:
                break
            qmin, qsum = self.quality(found)
            low, total = min(low, qmin), total + qsum
            pool &= ~found
        return (low, total)

    def grow(self, seed: int, pool: int, size: int) -> int:
        """A `size`-set from `pool` grown from GPU `seed`: each step adds the GPU whose worst and
        then total value to the members is highest."""
        members = [seed]
        mask = 1 << seed
        while len(members) < size:
            best, pick = None, -1
            for m in bits(pool & ~mask):
                vals = [self.value[m][o] for o in members]
                key = (min(vals), sum(vals), -m)
                if best is None or key > best:
                    best, pick = key, m
            if pick < 0:
                return 0
            members.append(pick)
            mask |= 1 << pick
        return mask

    def greedy_best(self, pool: int, size: int) -> int | None:
        best, found = None, None
        for seed in bits(pool)[:GREEDY_SEEDS]:
            mask = self.grow(seed, pool, size)
            if mask and (best is None or self.quality(mask) > best):
                best, found = self.quality(mask), mask
        return found


_TABLES: dict[tuple, tuple[PairTable, PairTable | None]] = {}


def tables(ic: Interconnect) -> tuple[PairTable, PairTable | None]:
    """The matrix by `values`, and by `pcie_values` where those break some tie (else None)."""
    key = ic.signature()
    found = _TABLES.get(key)
    if found is None:
        if len(_TABLES) > 256:
            _TABLES.clear()
        pcie = PairTable(ic.minors, ic.pcie_values) if ic.pcie_breaks_ties else None
        found = _TABLES[key] = (PairTable(ic.minors, ic.values), pcie)
    return found


def sets_in(mx: PairTable, region: int, count: int) -> tuple[list[int], bool]:
    """Every `count`-set of `region` (a bitmask) when it has at most EXACT_LIMIT GPUs, else the
    bounded search's sets; and whether the answer is exhaustive."""
    free = bits(region)
    if len(free) < count:
        return [], True
    if len(free) <= EXACT_LIMIT:
        return [mask_of(c) for c in combinations(free, count)], True
    return bounded_candidates(mx, region, count), False


def mask_of(minors: Sequence[int]) -> int:
    out = 0
    for m in minors:
        out |= 1 << m
    return out


def bounded_candidates(mx: PairTable, region: int, count: int) -> list[int]:
    """Beyond EXACT_LIMIT free GPUs: one set grown from each seed GPU (at most GREEDY_SEEDS
    seeds), plus the lowest free minors (what the scope walk would take)."""
    out = {mask_of(bits(region)[:count])}
    for seed in bits(region)[:GREEDY_SEEDS]:
        mask = mx.grow(seed, region, count)
        if mask:
            out.add(mask)
    return sorted(out)


def best_sets(ic: Interconnect, region: int, count: int) -> tuple[tuple[int, int], list[int]] | None:
    """The best quality (bottleneck, total) of a `count`-set inside `region` (a bitmask of
    minors) and the sets that have it: the chooser takes one of them. None when `region` is too
    small."""
    mx, _ = tables(ic)
    sets, _ = sets_in(mx, region, count)
    if not sets:
        return None
    top = max(mx.quality(s) for s in sets)
    return top, [s for s in sets if mx.quality(s) == top]
