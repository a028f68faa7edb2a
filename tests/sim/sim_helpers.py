"""Helpers for the simulator tests: tiny hand-made clusters on the production core, and requests."""

from __future__ import annotations

import json

from apis.annotations import parse_device_allocated
from simulator.cluster import SimCluster, SimRequest
from simulator.engine import OpenbRequests
from simulator.objects import openb_node_objects
from simulator.openb import OpenbNode, OpenbPod


def make_state(spec: list[tuple[int, int, list[int], int]], model: str = "M") -> SimCluster:
    """Nodes n0, n1, ... from (cpu capacity, memory MiB, per-GPU free %, cpu free), with that usage
    put on the core's NodeStates as bound pods (one per partly used GPU, one for the CPU)."""
    nodes = [OpenbNode(f"n{i}", cpu, mem, len(gpus), model) for i, (cpu, mem, gpus, _) in enumerate(spec)]
    cluster = SimCluster([openb_node_objects(n) for n in nodes])
    for i, (cpu, _, gpus, cpu_free) in enumerate(spec):
        for minor, free in enumerate(gpus):
            if free == 100:
                continue
            used = str(100 - free)
            entry = {
                "minor": minor,
                "resources": {"koordinator.sh/gpu-core": used, "koordinator.sh/gpu-memory-ratio": used},
            }
            allocations = parse_device_allocated(json.dumps({"gpu": [entry]}))
            cluster.core.assign(f"setup/n{i}-gpu{minor}", f"n{i}", allocations)
        if cpu_free < cpu:
            cluster.core.assign(f"setup/n{i}-cpu", f"n{i}", None, cpu - cpu_free)
    return cluster


_REQUESTS = OpenbRequests()


def request(
    cpu: int, gpu_pct: int = 0, count: int = 0, mem: int = 0, models: tuple[str, ...] = (), name: str = "p"
) -> SimRequest:
    return _REQUESTS(OpenbPod(name, cpu, mem, count, gpu_pct * 10 if count else 0, models))
