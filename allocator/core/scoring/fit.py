"""NodeResourcesFitPlus: a per-resource allocation strategy and weight (Koordinator's plugin).

Each resource the pod requests and the config names scores 0..100, MostAllocated (fuller is
better: bin-packing) or LeastAllocated (emptier is better: spreading); the node's score is their
weighted mean. Resources are keyed by kind: `cpu`, `memory`, `gpu`, `rdma`, `fpga`. GPUs count in
percent of one GPU's memory share (a whole GPU is 100), over healthy GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from allocator.core.request import PodRequest
from allocator.core.scoring.device import LEAST_ALLOCATED, MOST_ALLOCATED
from allocator.core.state import NodeState
from apis import resources as rn


@dataclass(frozen=True)
class ResourceStrategy:
    type: str = LEAST_ALLOCATED
    weight: int = 1

    def __post_init__(self) -> None:
        if self.type not in (LEAST_ALLOCATED, MOST_ALLOCATED):
            raise ValueError(
                f"strategy type must be {LEAST_ALLOCATED} or {MOST_ALLOCATED}, not {self.type!r}"
            )
        if self.weight < 0:
            raise ValueError("strategy weight must not be negative")


DEFAULT_FIT: Mapping[str, ResourceStrategy] = {
    "cpu": ResourceStrategy(LEAST_ALLOCATED, 1),
    "memory": ResourceStrategy(LEAST_ALLOCATED, 1),
    "gpu": ResourceStrategy(MOST_ALLOCATED, 1),
}


def gpu_share_request(state: NodeState, req: PodRequest) -> int:
    """The pod's GPU demand in percent of one GPU on this node (memory bytes converted by GPU size)."""
    g = req.gpu
    if g is None:
        return 0
    per = g.per_gpu_map
    if rn.GPU_MEMORY_RATIO in per:
        share = per[rn.GPU_MEMORY_RATIO]
    elif rn.GPU_MEMORY in per:
        size = state.inventory.gpu_memory_size if state.inventory is not None else 0
        share = per[rn.GPU_MEMORY] * 100 // size if size else 100
    else:
        share = per.get(rn.GPU_CORE, 100)
    return share * g.count


def _device_pair(state: NodeState, req: PodRequest, kind: str) -> tuple[int, int] | None:
    want = req.device_request(kind)
    inv = state.inventory
    if not want or inv is None:
        return None
    name = rn.RDMA if kind == rn.DeviceType.RDMA else rn.FPGA
    total = inv.type_totals.get(kind, {}).get(name, 0)
    free = sum(f.get(name, 0) for f in state.free.get(kind, {}).values())
    return total - free + want.get(name, 0), total


def fit_score(state: NodeState, req: PodRequest, strategies: Mapping[str, ResourceStrategy]) -> float | None:
    """0..100, or None when the pod requests none of the configured resources."""
    total = weight_sum = 0
    for kind, strategy in strategies.items():
        weight = strategy.weight
        if not weight:
            continue
        if kind == "cpu":
            if not req.cpu_milli:
                continue
            requested, capacity = (
                state.nonzero_cpu_milli + req.nonzero_cpu_milli,
                state.allocatable.get(rn.CPU, 0),
            )
        elif kind == "memory":
            if not req.memory:
                continue
            requested, capacity = (
                state.nonzero_memory + req.nonzero_memory,
                state.allocatable.get(rn.MEMORY, 0),
            )
        elif kind == "gpu":
            if req.gpu is None:
                continue
            capacity = state.gpu_total_ratio
            requested = capacity - state.gpu_free_ratio + gpu_share_request(state, req)
        else:
            pair = (
                _device_pair(state, req, kind) if kind in (rn.DeviceType.RDMA, rn.DeviceType.FPGA) else None
            )
            if pair is None:
                continue
            requested, capacity = pair
        if capacity <= 0:
            score = 0
        elif strategy.type == MOST_ALLOCATED:
            score = min(requested, capacity) * 100 // capacity
        else:
            score = (capacity - requested) * 100 // capacity if requested <= capacity else 0
        total += score * weight
        weight_sum += weight
    if weight_sum == 0:
        return None
    return total / weight_sum
