"""Koordinator's device-level scoring primitives (protocol section 6): binpack or spread.

`score_device` ranks one device for a request; `score_node` does the same over all devices of a
type summed. Integer arithmetic throughout, exactly as DeviceShareArgs' scorer does it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from apis import resources as rn

LEAST_ALLOCATED = "LeastAllocated"
MOST_ALLOCATED = "MostAllocated"
STRATEGIES = (LEAST_ALLOCATED, MOST_ALLOCATED)
MAX_SCORE = 100

# DeviceShareArgs' default weights (gpu-core is deliberately not weighted).
DEFAULT_WEIGHTS: Mapping[str, int] = {rn.GPU_MEMORY_RATIO: 1, rn.GPU_MEMORY: 1, rn.RDMA: 1, rn.FPGA: 1}


def least_requested(requested: int, capacity: int) -> int:
    if capacity == 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_SCORE // capacity


def most_requested(requested: int, capacity: int) -> int:
    if capacity == 0:
        return 0
    return min(requested, capacity) * MAX_SCORE // capacity


@dataclass(frozen=True)
class DeviceScoring:
    """DeviceShareArgs.scoringStrategy: the strategy and the weighted resource names."""

    strategy: str = LEAST_ALLOCATED
    weights: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"device scoring strategy must be one of {', '.join(STRATEGIES)}")

    def _combine(self, pairs: Iterable[tuple[str, int, int]]) -> int:
        per = most_requested if self.strategy == MOST_ALLOCATED else least_requested
        total = weight_sum = 0
        for name, requested, capacity in pairs:
            weight = self.weights[name]
            total += per(requested, capacity) * weight
            weight_sum += weight
        return total // weight_sum if weight_sum else 0

    def score_device(
        self, request: Mapping[str, int], total: Mapping[str, int], free: Mapping[str, int]
    ) -> int:
        """0..100 for putting `request` on a device with `total` and `free` (names by weight)."""
        return self._combine(_pairs(self.weights, request, total, free))

    def score_node(
        self,
        request: Mapping[str, int],
        totals: Iterable[Mapping[str, int]],
        frees: Iterable[Mapping[str, int]],
    ) -> int:
        """The same over every device of a type, totals and frees summed per resource."""
        totals, frees = list(totals), list(frees)
        summed_total = {n: sum(t.get(n, 0) for t in totals) for n in self.weights}
        summed_free = {n: sum(f.get(n, 0) for f in frees) for n in self.weights}
        return self._combine(_pairs(self.weights, request, summed_total, summed_free))


def _pairs(
    weights: Mapping[str, int], request: Mapping[str, int], total: Mapping[str, int], free: Mapping[str, int]
) -> Iterable[tuple[str, int, int]]:
    for name in weights:
        cap = total.get(name, 0)
        if cap == 0:
            continue
        have = free.get(name, 0)
        requested = cap - have + request.get(name, 0) if cap >= have else cap
        yield name, requested, cap
