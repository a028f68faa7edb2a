"""The whole-GPU set chooser: the set of `count` free GPUs that maximises one objective
(docs/gpu-sets.md), compared as a tuple, best first:

1. quality: the set's bottleneck pair value, then the sum of its pair values (the node's
   interconnect matrix, `apis.interconnect`);
2. leftover: the best packing of the GPUs it leaves free into sets of the same size (at least
   pairs): its bottleneck, then its total, so the next pod also finds a good set;
3. NIC alignment for joint GPU+RDMA pods: fewer chosen GPUs without a free NIC on their PCIe switch;
4. bin-packing: more of the scopes (node, NUMA node, PCIe) that the set touches already in use
   (Koordinator's walk rule);
5. the lowest minors.

Exact for up to `EXACT_LIMIT` free GPUs (every subset is enumerated as a bitmask; 70 sets for 4 of
8); beyond, a bounded greedy search. Pure: bitmasks in, a choice out. Answers are remembered per
(matrix, free GPUs, request) in bounded caches, so nodes of one machine type share them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from apis.interconnect import Interconnect, describe_value

EXACT_LIMIT = 8  # free GPUs up to which every candidate set (and every packing) is enumerated
GREEDY_SEEDS = 16  # seeds of the bounded search beyond
_CACHE_MAX = 20_000
_NONE = (-1, -1)


@dataclass(frozen=True, order=True)
class Objective:
    quality_min: int
    quality_sum: int
    leftover_min: int
    leftover_sum: int
    nic_aligned: int  # minus the chosen GPUs without a free NIC on their switch (joint pods)
    binpack: int  # scopes touched by the set that already hold a used GPU
    tie: tuple[int, ...]  # minus the minors: the lowest minors win

    def terms(self) -> str:
        """The decisive numbers, readable: bottlenecks as bandwidth and host relation, totals as
        summed NVLink bandwidth over all pairs."""
        if len(self.tie) < 2:
            quality = "one GPU"
        else:
            quality = f"bottleneck {describe_value(self.quality_min)}, total {_total(self.quality_sum)}"
        left = "nothing to pack"
        if self.leftover_sum or self.leftover_min:
            left = f"{describe_value(self.leftover_min)}, total {_total(self.leftover_sum)}"
        return f"{quality}; leaves {left}; nic {self.nic_aligned}; binpack {self.binpack}"


def _total(value: int) -> str:
    return f"{value // 8 / 1000:g} GB/s"


@dataclass(frozen=True)
class SetRequest:
    """What the chooser needs of the pod and of the node's state, as bitmasks over minors."""

    count: int
    candidates: int  # GPUs the set may use (free, feasible, selectors applied)
    pool: int  # GPUs left for later pods to pack (free whole GPUs)
    used: int = 0  # GPUs with any usage (bin-packing)
    within: tuple[int, ...] | None = None  # a required scope: the set lies inside one of these
    scopes: tuple[int, ...] = ()  # every scope of the tree, for bin-packing
    nic_ok: int | None = None  # joint RDMA: GPUs with a free NIC on their switch (None: not asked)


@dataclass(frozen=True)
class Choice:
    minors: tuple[int, ...]
    objective: Objective
    ranked: tuple[tuple[tuple[int, ...], Objective], ...]  # best first, for --explain
    exact: bool


def bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class _Matrix:
    """An Interconnect indexed by minor, with remembered set qualities and packings."""

    def __init__(self, ic: Interconnect) -> None:
        self.ic = ic
        size = max(ic.minors, default=-1) + 1
        self.value = [[0] * size for _ in range(size)]
        for i, a in enumerate(ic.minors):
            for j, b in enumerate(ic.minors):
                self.value[a][b] = ic.values[i][j]
        self._quality: dict[int, tuple[int, int]] = {}
        self._packing: dict[tuple[int, int, int], tuple[int, int]] = {}

    def quality(self, mask: int) -> tuple[int, int]:
        hit = self._quality.get(mask)
        if hit is None:
            members = bits(mask)
            if len(members) < 2:
                hit = (0, 0)
            else:
                vals = [self.value[a][b] for a, b in combinations(members, 2)]
                hit = (min(vals), sum(vals))
            if len(self._quality) > _CACHE_MAX:
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
        if sets == 0:
            return (1 << 62, 0)
        key = (pool, sets, size)
        hit = self._packing.get(key)
        if hit is not None:
            return hit
        low = pool & -pool
        rest = pool ^ low
        best = _NONE
        if rest.bit_count() >= sets * size:  # leave the lowest GPU out of every set
            best = self._pack(rest, sets, size)
        for others in combinations(bits(rest), size - 1):
            chosen = low
            for m in others:
                chosen |= 1 << m
            qmin, qsum = self.quality(chosen)
            tail_min, tail_sum = self._pack(pool & ~chosen, sets - 1, size)
            value = (min(qmin, tail_min), qsum + tail_sum)
            if value > best:
                best = value
        if len(self._packing) > _CACHE_MAX:
            self._packing.clear()
        self._packing[key] = best
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


_MATRICES: dict[tuple, _Matrix] = {}


def matrix_for(ic: Interconnect) -> _Matrix:
    key = ic.signature()
    found = _MATRICES.get(key)
    if found is None:
        if len(_MATRICES) > 256:
            _MATRICES.clear()
        found = _MATRICES[key] = _Matrix(ic)
    return found


def _sets_in(mx: _Matrix, region: int, count: int) -> tuple[list[int], bool]:
    """Every `count`-set of `region` (a bitmask) when it has at most EXACT_LIMIT GPUs, else the
    bounded search's sets; and whether the answer is exhaustive."""
    free = bits(region)
    if len(free) < count:
        return [], True
    if len(free) <= EXACT_LIMIT:
        return [_mask(c) for c in combinations(free, count)], True
    return _bounded_candidates(mx, region, count), False


def _mask(minors: Sequence[int]) -> int:
    out = 0
    for m in minors:
        out |= 1 << m
    return out


_CHOICES: dict[tuple, Choice | None] = {}


def choose(ic: Interconnect, req: SetRequest, *, keep: int = 8) -> Choice | None:
    """The best set of `req.count` GPUs among `req.candidates`, or None when there is none.
    Remembered per (matrix, request): nodes of one machine type in one state share the answer."""
    key = (ic.signature(), req, keep)
    if key in _CHOICES:
        return _CHOICES[key]
    found = _choose(ic, req, keep)
    if len(_CHOICES) > _CACHE_MAX:
        _CHOICES.clear()
    _CHOICES[key] = found
    return found


def _choose(ic: Interconnect, req: SetRequest, keep: int) -> Choice | None:
    mx = matrix_for(ic)
    regions = [req.candidates] if req.within is None else [req.candidates & s for s in req.within]
    found: set[int] = set()
    exact = True
    for region in regions:
        sets, complete = _sets_in(mx, region, req.count)
        found.update(sets)
        exact = exact and complete
    if not found:
        return None
    # Quality first: only the sets tied for the best quality need the rest of the objective.
    scored = sorted(((mx.quality(s), s) for s in found), reverse=True)
    top = scored[0][0]
    size = max(req.count, 2)
    ranked = [
        (s, _objective(mx, req, s, quality, size))
        for n, (quality, s) in enumerate(scored)
        if quality == top or n < keep
    ]
    ranked.sort(key=lambda t: t[1], reverse=True)
    best_mask, best = ranked[0]
    return Choice(
        tuple(bits(best_mask)),
        best,
        tuple((tuple(bits(s)), o) for s, o in ranked[:keep]),
        exact,
    )


def _objective(mx: _Matrix, req: SetRequest, s: int, quality: tuple[int, int], size: int) -> Objective:
    left = mx.packing(req.pool & ~s, size)
    nic = 0 if req.nic_ok is None else -(s & ~req.nic_ok).bit_count()
    binpack = sum(1 for scope in req.scopes if scope & s and scope & req.used)
    return Objective(quality[0], quality[1], left[0], left[1], nic, binpack, tuple(-m for m in bits(s)))


def _bounded_candidates(mx: _Matrix, region: int, count: int) -> list[int]:
    """Beyond EXACT_LIMIT free GPUs: one set grown from each seed GPU (at most GREEDY_SEEDS
    seeds), plus the lowest free minors (what the scope walk would take)."""
    out = {_mask(bits(region)[:count])}
    for seed in bits(region)[:GREEDY_SEEDS]:
        mask = mx.grow(seed, region, count)
        if mask:
            out.add(mask)
    return sorted(out)
