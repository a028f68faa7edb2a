"""Which of this node's GPUs the agent gives a pod it serves without an allocation (node_choice.py).

Whole GPUs: the set of `count` candidates that is best by the node's interconnect matrix
(apis/interconnect.py, the matrix the allocator chooses GPU sets by, docs/gpu-sets.md), compared
as a tuple, best first:

1. quality: the set's weakest pair, then the sum of its pairs. A pair's value is its NVLink
   bandwidth first, then its host relation (same PCIe switch > same root complex > same NUMA node >
   same socket > across sockets), so a set inside one NVLink domain wins when the count allows,
   else one behind one PCIe switch, else one on one NUMA node, else the fewest cross-socket pairs;
2. what it leaves free: the best grouping of the other free GPUs into sets of the same size (at
   least pairs), so the next pod still finds a good set;
3. for a pod whose NICs go next to its GPUs: fewer GPUs without such a NIC behind their switch;
4. the PCIe relation where NVLink ties (an NVLink pair behind one switch first);
5. bin-packing: more of the scopes it touches (NUMA node, PCIe switch, root) already in use;
6. the lowest minors.

Every set is compared up to EXACT_SETS candidate sets; beyond, sets grown greedily from each GPU.
Shares: the GPU whose free share fits best (the least left over), then the lowest minor.

Pure: minors in, minors out.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import combinations

from apis.interconnect import Interconnect, best_groups

EXACT_SETS = 5000  # candidate sets compared one by one up to this many
CACHE_MAX = 4096  # remembered answers (per machine type and state), then forgotten at once


def _quality(
    values: Sequence[Sequence[int]], idx: Mapping[int, int], members: Sequence[int]
) -> tuple[int, int]:
    if len(members) < 2:
        return (0, 0)
    vals = [values[idx[a]][idx[b]] for a, b in combinations(members, 2)]
    return (min(vals), sum(vals))


_GROUPS: dict[tuple, list[tuple[int, ...]]] = {}


def _groups(ic: Interconnect, rest: tuple[int, ...], size: int) -> list[tuple[int, ...]]:
    """`best_groups`, remembered: the same free GPUs come back pod after pod."""
    key = (ic.signature(), rest, size)
    if key not in _GROUPS:
        if len(_GROUPS) >= CACHE_MAX:
            _GROUPS.clear()
        _GROUPS[key] = best_groups(ic, rest, size)
    return _GROUPS[key]


def _leftover(ic: Interconnect, idx: Mapping[int, int], rest: tuple[int, ...], size: int) -> tuple[int, int]:
    groups = _groups(ic, rest, size)
    if not groups:
        return (0, 0)
    scores = [_quality(ic.values, idx, g) for g in groups]
    return (min(s[0] for s in scores), sum(s[1] for s in scores))


def _grown(
    ic: Interconnect, idx: Mapping[int, int], seed: int, pool: Sequence[int], count: int
) -> tuple[int, ...]:
    """A set grown from `seed`: each step adds the GPU with the best worst-then-total pair to the
    members."""
    members = [seed]
    while len(members) < count:
        options = [m for m in pool if m not in members]
        if not options:
            break
        members.append(
            max(
                options,
                key=lambda m: (
                    min(ic.values[idx[m]][idx[o]] for o in members),
                    sum(ic.values[idx[m]][idx[o]] for o in members),
                    -m,
                ),
            )
        )
    return tuple(sorted(members))


def _sets(
    ic: Interconnect, idx: Mapping[int, int], cands: Sequence[int], count: int
) -> Iterable[tuple[int, ...]]:
    if math.comb(len(cands), count) <= EXACT_SETS:
        return combinations(cands, count)
    found = {tuple(cands[:count])}
    found.update(_grown(ic, idx, seed, cands, count) for seed in cands)
    return [s for s in found if len(s) == count]


_ANSWERS: dict[tuple, tuple[int, ...] | None] = {}


def best_set(
    ic: Interconnect,
    candidates: Collection[int],
    count: int,
    *,
    pool: Collection[int],
    used: Collection[int] = (),
    near_nic: Collection[int] | None = None,
    scopes: Mapping[int, tuple[str, ...]] | None = None,
) -> tuple[int, ...] | None:
    """The best `count` GPUs among `candidates` (minors), or None when there are too few.
    `pool`: the free GPUs a later pod could still use (for what a choice leaves); `used`: GPUs in
    use (bin-packing, over each GPU's `scopes`); `near_nic`: GPUs with a NIC for the pod behind
    their switch (None: the pod asks no such thing). Answers are remembered: a node meets the same
    question in GetPreferredAllocation and Allocate, and again for later pods."""
    key = (
        ic.signature(),
        tuple(sorted(candidates)),
        count,
        tuple(sorted(pool)),
        tuple(sorted(used)),
        None if near_nic is None else tuple(sorted(near_nic)),
        tuple(sorted((scopes or {}).items())),
    )
    if key not in _ANSWERS:
        if len(_ANSWERS) >= CACHE_MAX:
            _ANSWERS.clear()
        _ANSWERS[key] = _best_set(ic, candidates, count, pool, used, near_nic, scopes)
    return _ANSWERS[key]


def _best_set(
    ic: Interconnect,
    candidates: Collection[int],
    count: int,
    pool: Collection[int],
    used: Collection[int],
    near_nic: Collection[int] | None,
    scopes: Mapping[int, tuple[str, ...]] | None,
) -> tuple[int, ...] | None:
    cands = sorted(candidates)
    if count <= 0 or len(cands) < count:
        return None
    idx = {m: ic.index(m) for m in ic.minors}
    scored = [(_quality(ic.values, idx, s), s) for s in _sets(ic, idx, cands, count)]
    top = max(q for q, _ in scored)
    size = max(count, 2)
    busy = {key for m in used for key in (scopes or {}).get(m, ())}

    def rest_of(s: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(m for m in sorted(pool) if m not in s)

    def objective(q: tuple[int, int], s: tuple[int, ...]) -> tuple:
        rest = rest_of(s)
        nic = 0 if near_nic is None else -sum(1 for m in s if m not in near_nic)
        fine = _quality(ic.pcie_values, idx, s)
        fine_left = (0, 0)
        if ic.pcie_breaks_ties:
            left = _groups(ic, rest, size)
            fine_left = (
                min((_quality(ic.pcie_values, idx, g)[0] for g in left), default=0),
                sum(_quality(ic.pcie_values, idx, g)[1] for g in left),
            )
        touched = {key for m in s for key in (scopes or {}).get(m, ())}
        return (
            q,
            _leftover(ic, idx, rest, size),
            nic,
            fine,
            fine_left,
            len(touched & busy),
            tuple(-m for m in s),
        )

    return max((objective(q, s), s) for q, s in scored if q == top)[1]


def best_fit(free: Mapping[int, tuple[int, int]], core: int, ratio: int, count: int) -> list[int] | None:
    """`count` GPUs whose free (compute, memory) percent fits (`core`, `ratio`) most tightly; None
    when fewer fit."""
    fits = [(fc - core, fr - ratio, m) for m, (fc, fr) in free.items() if fc >= core and fr >= ratio]
    if len(fits) < count:
        return None
    return sorted(m for _, _, m in sorted(fits)[:count])
