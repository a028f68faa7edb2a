"""In-memory cluster state for trace replay: per-node free resources kept incrementally.

Only the node a pod lands on changes, so each placement updates that node's row of the
vectorised summaries (numpy arrays over nodes, used to filter every node at once) and bumps its
version (used by policies to invalidate per-(node, task shape) score caches). GPU shares are in
percent of one GPU (openb's milli / 10, exact for every openb trace), the unit of Koordinator's
``gpu-core`` and of the production scorer's summaries.

This is the seam for driving the production core instead: a state offers ``feasible(request)``,
``place(node, request, gpus)`` and the per-node views the policies read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from allocator.core.scoring.fragmentation import node_fragment
from allocator.core.scoring.workload_mix import TaskShape, WorkloadMix
from simulator.openb import OpenbNode, OpenbPod

FULL = 100  # a whole GPU, in percent


@dataclass(frozen=True, slots=True)
class Request:
    """One pod as the simulator places it. ``shape_id`` indexes the trace's distinct shapes
    (cpu, per-GPU share, GPU count, models) so policies can cache per shape."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_pct: int  # per GPU; 100 = whole GPU, 0 = CPU-only
    gpu_count: int
    models: tuple[str, ...]
    shape: TaskShape
    shape_id: int

    @property
    def demand_pct(self) -> int:
        return self.gpu_pct * self.gpu_count

    @property
    def sharing(self) -> bool:
        return 0 < self.gpu_pct < FULL


def to_requests(pods: Sequence[OpenbPod]) -> list[Request]:
    """Requests for pods in arrival order; equal shapes share one ``shape_id``."""
    ids: dict[TaskShape, int] = {}
    out = []
    for p in pods:
        shape = p.shape()
        sid = ids.setdefault(shape, len(ids))
        out.append(
            Request(p.name, p.cpu_milli, p.memory_mib, shape.gpu_pct, shape.gpu_count, p.gpu_spec, shape, sid)
        )
    return out


class ClusterState:
    """Free CPU, memory and per-GPU share of every node, plus the fragmentation of each node
    with respect to ``metrics_mix`` (for the paper's fragmentation metrics)."""

    def __init__(self, nodes: Sequence[OpenbNode], metrics_mix: WorkloadMix | None = None) -> None:
        self.nodes = list(nodes)
        n = len(self.nodes)
        self.size = n
        self.models = [node.model for node in self.nodes]
        self.gpus: list[list[int]] = [[FULL] * node.gpu_count for node in self.nodes]
        self.gpu_count = np.array([node.gpu_count for node in self.nodes], dtype=np.int64)
        self.cpu_capacity = np.array([node.cpu_milli for node in self.nodes], dtype=np.int64)
        self.cpu_free = self.cpu_capacity.copy()
        self.mem_free = np.array([node.memory_mib for node in self.nodes], dtype=np.int64)
        self.gpu_free_total = self.gpu_count * FULL
        self.gpu_free_max = np.where(self.gpu_count > 0, FULL, 0).astype(np.int64)
        self.gpu_full_count = self.gpu_count.copy()
        # per-GPU free share, -1 where a node has fewer GPUs than the widest node (never fits)
        width = max(int(self.gpu_count.max(initial=0)), 1)
        self.gpu_matrix = np.full((n, width), -1, dtype=np.int64)
        for i, node in enumerate(self.nodes):
            self.gpu_matrix[i, : node.gpu_count] = FULL
        self.version = np.zeros(n, dtype=np.int64)
        self.capacity_pct = int(self.gpu_count.sum()) * FULL
        self._model_masks: dict[tuple[str, ...], np.ndarray] = {}
        self._has_gpu = self.gpu_count > 0
        self.metrics_mix = metrics_mix
        self.node_frag = np.zeros(n, dtype=np.float64)
        if metrics_mix is not None:
            for i in range(n):
                self.node_frag[i] = self._frag_of(i)

    def _frag_of(self, i: int) -> float:
        assert self.metrics_mix is not None
        return node_fragment(
            self.gpus[i], int(self.cpu_free[i]), self.metrics_mix.compiled_for(self.models[i])
        )

    def model_mask(self, models: tuple[str, ...]) -> np.ndarray:
        mask = self._model_masks.get(models)
        if mask is None:
            allowed = set(models)
            mask = np.array([m in allowed for m in self.models], dtype=bool) & self._has_gpu
            self._model_masks[models] = mask
        return mask

    def feasible(self, req: Request) -> np.ndarray:
        """Nodes that can take the request: NodeResourcesFit (CPU, memory) and Open-Gpu-Share
        (GPU model, one GPU with enough free share, or enough fully free GPUs)."""
        mask = (self.cpu_free >= req.cpu_milli) & (self.mem_free >= req.memory_mib)
        if req.gpu_count:
            if req.gpu_pct < FULL:
                mask &= self.gpu_free_max >= req.gpu_pct
            else:
                mask &= self.gpu_full_count >= req.gpu_count
            if req.models:
                mask &= self.model_mask(req.models)
        return mask

    def place(self, i: int, req: Request, gpus: Sequence[int]) -> None:
        gpu = self.gpus[i]
        for g in gpus:
            if gpu[g] < req.gpu_pct:
                raise ValueError(f"GPU {g} of node {self.nodes[i].name} has {gpu[g]}% free < {req.gpu_pct}%")
            gpu[g] -= req.gpu_pct
        if len(gpus) != req.gpu_count:
            raise ValueError(f"{req.name} needs {req.gpu_count} GPUs, got {list(gpus)}")
        self.cpu_free[i] -= req.cpu_milli
        self.mem_free[i] -= req.memory_mib
        if self.cpu_free[i] < 0 or self.mem_free[i] < 0:
            raise ValueError(f"{req.name} overcommits node {self.nodes[i].name}")
        self.gpu_matrix[i, : len(gpu)] = gpu
        self.gpu_free_total[i] = sum(gpu)
        self.gpu_free_max[i] = max(gpu, default=0)
        self.gpu_full_count[i] = gpu.count(FULL)
        self.version[i] += 1
        if self.metrics_mix is not None:
            self.node_frag[i] = self._frag_of(i)

    @property
    def allocated_pct(self) -> int:
        return self.capacity_pct - int(self.gpu_free_total.sum())
