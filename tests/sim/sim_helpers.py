"""Helpers for the simulator tests: tiny hand-made clusters and requests."""

from __future__ import annotations

from simulator.cluster import ClusterState, Request, to_requests
from simulator.openb import OpenbNode, OpenbPod


def make_state(spec: list[tuple[int, int, list[int], int]], model: str = "M") -> ClusterState:
    """Nodes from (cpu capacity, memory MiB, per-GPU free %, cpu free) with that usage applied."""
    nodes = [OpenbNode(f"n{i}", cpu, mem, len(gpus), model) for i, (cpu, mem, gpus, _) in enumerate(spec)]
    state = ClusterState(nodes)
    for i, (_, _, gpus, cpu_free) in enumerate(spec):
        state.gpus[i][:] = gpus
        state.gpu_matrix[i, : len(gpus)] = gpus
        state.gpu_free_total[i] = sum(gpus)
        state.gpu_free_max[i] = max(gpus, default=0)
        state.gpu_full_count[i] = gpus.count(100)
        state.cpu_free[i] = cpu_free
    return state


def request(
    cpu: int, gpu_pct: int = 0, count: int = 0, mem: int = 0, models: tuple[str, ...] = ()
) -> Request:
    pod = OpenbPod("p", cpu, mem, count, gpu_pct * 10, models)
    return to_requests([pod])[0]
