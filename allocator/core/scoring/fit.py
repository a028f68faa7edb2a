"""NodeResourcesFitPlus: a per-resource allocation strategy and weight (Koordinator's plugin).

Each resource the pod requests and the config names scores 0..100, MostAllocated (fuller is
better: bin-packing) or LeastAllocated (emptier is better: spreading); the node's score is their
weighted mean. Resources are keyed by kind: `cpu`, `memory`, `gpu`, `rdma`, `fpga`. GPUs count in
percent of one GPU's memory share (a whole GPU is 100), over healthy GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.state import NodeState
from allocator.core.request.pod_request import PodRequest
from allocator.core.scoring.device import LEAST_ALLOCATED, MOST_ALLOCATED
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


def gpu_share_request(req: PodRequest, gpu_memory_size: int = 0) -> int:
    """The pod's GPU demand in percent of one GPU (memory bytes converted by the node's GPU size)."""
    g = req.gpu
    if g is None:
        return 0
    per = g.per_gpu_map
    if rn.GPU_MEMORY_RATIO in per:
        share = per[rn.GPU_MEMORY_RATIO]
    elif rn.GPU_MEMORY in per:
        share = per[rn.GPU_MEMORY] * 100 // gpu_memory_size if gpu_memory_size else 100
    else:
        share = per.get(rn.GPU_CORE, 100)
    return share * g.count


def _memory_size(state: NodeState) -> int:
    return state.inventory.gpu_memory_size if state.inventory is not None else 0


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
    prepared = prepare_fit(req, strategies)
    return None if prepared is None else prepared(state)


_CPU, _MEMORY, _GPU, _DEVICE = range(4)


def prepare_fit(
    req: PodRequest, strategies: Mapping[str, ResourceStrategy]
) -> Callable[[NodeState], float] | None:
    """`fit_score` specialised for one request (None when it requests nothing configured): the
    per-node part is a few integer operations."""
    terms: list[tuple[int, bool, int, Any]] = []
    for kind, strategy in strategies.items():
        most, weight = strategy.type == MOST_ALLOCATED, strategy.weight
        if not weight:
            continue
        if kind == "cpu" and req.cpu_milli:
            terms.append((_CPU, most, weight, req.nonzero_cpu_milli))
        elif kind == "memory" and req.memory:
            terms.append((_MEMORY, most, weight, req.nonzero_memory))
        elif kind == "gpu" and req.gpu is not None:
            terms.append((_GPU, most, weight, None))
        elif kind in (rn.DeviceType.RDMA, rn.DeviceType.FPGA) and req.device_request(kind):
            terms.append((_DEVICE, most, weight, kind))
    if not terms:
        return None
    weight_sum = sum(t[2] for t in terms)
    g = req.gpu
    # The pod's GPU share is node-independent unless it asks for memory in bytes.
    fixed_share = None if g is None or rn.GPU_MEMORY in g.per_gpu_map else gpu_share_request(req)

    def score(state: NodeState) -> float:
        total = 0
        for code, most, weight, extra in terms:
            if code == _CPU:
                requested, capacity = state.nonzero_cpu_milli + extra, state.allocatable_cpu_milli
            elif code == _MEMORY:
                requested, capacity = state.nonzero_memory + extra, state.allocatable_memory
            elif code == _GPU:
                gpus = GPUSummary.of(state)
                capacity = gpus.total_ratio
                share = (
                    fixed_share if fixed_share is not None else gpu_share_request(req, _memory_size(state))
                )
                requested = capacity - gpus.free_ratio + share
            else:
                pair = _device_pair(state, req, extra)
                if pair is None:
                    requested, capacity = 0, 0
                else:
                    requested, capacity = pair
            if capacity <= 0:
                value = 0
            elif most:
                value = min(requested, capacity) * 100 // capacity
            else:
                value = (capacity - requested) * 100 // capacity if requested <= capacity else 0
            total += value * weight
        return total / weight_sum

    return score
