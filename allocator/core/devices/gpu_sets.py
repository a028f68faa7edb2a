"""The whole-GPU set chooser: the set of `count` free GPUs that maximises one objective
(docs/gpu-sets.md), compared as a tuple, best first:

1. quality: the set's bottleneck pair value, then the sum of its pair values (the node's
   interconnect matrix, `apis.interconnect`: NVLink bandwidth, then the host relation up to the
   NUMA node);
2. leftover: the best packing of the GPUs it leaves free into sets of the same size (at least
   pairs): its bottleneck, then its total, so the next pod also finds a good set;
3. NIC alignment for joint GPU+RDMA pods: fewer chosen GPUs without a free NIC on their PCIe switch;
4. the PCIe relation where NVLink ties: quality, then leftover, again, by the matrix's
   `pcie_values` (an NVLink pair behind one switch before one across the host bridge);
5. bin-packing: more of the scopes (node, NUMA node, PCIe) that the set touches already in use
   (Koordinator's walk rule);
6. the lowest minors.

Exact for up to `EXACT_LIMIT` free GPUs (every subset is enumerated as a bitmask; 70 sets for 4 of
8); beyond, a bounded greedy search. Pure: bitmasks in, a choice out. Answers are remembered per
(matrix, free GPUs, request) in bounded caches, so nodes of one machine type share them.
"""

from __future__ import annotations

from dataclasses import dataclass

from allocator.core.node.gpu_pairs import CACHE_MAX, PairTable, bits, sets_in, tables
from apis.interconnect import Interconnect, describe_value

_ZERO = (0, 0)


@dataclass(frozen=True, order=True)
class Objective:
    quality_min: int
    quality_sum: int
    leftover_min: int
    leftover_sum: int
    nic_aligned: int  # minus the chosen GPUs without a free NIC on their switch (joint pods)
    # quality and leftover by `pcie_values`; 0 on a node where they would repeat the first four
    pcie_min: int
    pcie_sum: int
    pcie_leftover_min: int
    pcie_leftover_sum: int
    binpack: int  # scopes touched by the set that already hold a used GPU
    tie: tuple[int, ...]  # minus the minors: the lowest minors win

    @property
    def before_pcie(self) -> tuple[int, int, int, int, int]:
        return (self.quality_min, self.quality_sum, self.leftover_min, self.leftover_sum, self.nic_aligned)

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
        pcie = ""
        if self.pcie_min or self.pcie_sum or self.pcie_leftover_min:
            low, left_low = describe_value(self.pcie_min), describe_value(self.pcie_leftover_min)
            pcie = f"; PCIe: bottleneck {low}, leaves {left_low}"
        return f"{quality}; leaves {left}; nic {self.nic_aligned}{pcie}; binpack {self.binpack}"


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


_CHOICES: dict[tuple, Choice | None] = {}


def choose(ic: Interconnect, req: SetRequest, *, keep: int = 8) -> Choice | None:
    """The best set of `req.count` GPUs among `req.candidates`, or None when there is none.
    Remembered per (matrix, request): nodes of one machine type in one state share the answer."""
    key = (ic.signature(), req, keep)
    if key in _CHOICES:
        return _CHOICES[key]
    found = _choose(ic, req, keep)
    if len(_CHOICES) > CACHE_MAX:
        _CHOICES.clear()
    _CHOICES[key] = found
    return found


def _choose(ic: Interconnect, req: SetRequest, keep: int) -> Choice | None:
    mx, pcie = tables(ic)
    regions = [req.candidates] if req.within is None else [req.candidates & s for s in req.within]
    found: set[int] = set()
    exact = True
    for region in regions:
        sets, complete = sets_in(mx, region, req.count)
        found.update(sets)
        exact = exact and complete
    if not found:
        return None
    # Quality first: only the sets tied for the best quality need the rest of the objective.
    scored = sorted(((mx.quality(s), s) for s in found), reverse=True)
    top = scored[0][0]
    size = max(req.count, 2)
    ranked = [
        (s, _objective(mx, None, req, s, quality, size))
        for n, (quality, s) in enumerate(scored)
        if quality == top or n < keep
    ]
    if pcie is not None:
        # The PCIe relation only breaks ties: it is weighed for the sets tied with the best on
        # everything before it (0 in the others' explanation lines).
        lead = max(o.before_pcie for _, o in ranked)
        ranked = [
            (
                s,
                _objective(mx, pcie, req, s, (o.quality_min, o.quality_sum), size)
                if o.before_pcie == lead
                else o,
            )
            for s, o in ranked
        ]
    ranked.sort(key=lambda t: t[1], reverse=True)
    best_mask, best = ranked[0]
    return Choice(
        tuple(bits(best_mask)),
        best,
        tuple((tuple(bits(s)), o) for s, o in ranked[:keep]),
        exact,
    )


def _objective(
    mx: PairTable, pcie: PairTable | None, req: SetRequest, s: int, quality: tuple[int, int], size: int
) -> Objective:
    rest = req.pool & ~s
    left = mx.packing(rest, size)
    nic = 0 if req.nic_ok is None else -(s & ~req.nic_ok).bit_count()
    fine, fine_left = (pcie.quality(s), pcie.packing(rest, size)) if pcie is not None else (_ZERO, _ZERO)
    binpack = sum(1 for scope in req.scopes if scope & s and scope & req.used)
    return Objective(
        quality[0], quality[1], left[0], left[1], nic, *fine, *fine_left, binpack, tuple(-m for m in bits(s))
    )
