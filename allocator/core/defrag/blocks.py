"""How fragmented the GPUs are: the largest free block (the most whole GPUs free on one node, which
on an NVSwitch machine is one NVLink partition) and the nodes wholly free, for the planner's
proactive mode, the CLI and the simulator."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.node.state import NodeState


@dataclass(frozen=True)
class Fragmentation:
    gpus: int  # healthy GPUs
    free: int  # whole GPUs free
    largest_block: int  # the most whole GPUs free on one node
    nodes_free: int  # GPU nodes with every healthy GPU free
    gpu_nodes: int
    histogram: tuple[tuple[int, int], ...]  # (whole GPUs free on a node, how many nodes), ascending


def node_block(state: NodeState) -> int:
    return GPUSummary.of(state).whole_free


def largest_block(nodes: Iterable[NodeState]) -> int:
    return max((node_block(s) for s in nodes), default=0)


def block_rank(nodes: Iterable[NodeState]) -> tuple[int, int]:
    """(the largest free block, how many nodes have one that large): what proactive moves raise."""
    blocks = [node_block(s) for s in nodes]
    top = max(blocks, default=0)
    return top, blocks.count(top) if top else 0


def fragmentation(nodes: Mapping[str, NodeState]) -> Fragmentation:
    gpus = free = largest = whole_nodes = gpu_nodes = 0
    counts: dict[int, int] = {}
    for state in nodes.values():
        summary = GPUSummary.of(state)
        healthy = summary.healthy_count
        if not healthy:
            continue
        gpu_nodes += 1
        block = summary.whole_free
        gpus += healthy
        free += block
        largest = max(largest, block)
        whole_nodes += block == healthy
        counts[block] = counts.get(block, 0) + 1
    return Fragmentation(gpus, free, largest, whole_nodes, gpu_nodes, tuple(sorted(counts.items())))


def partitions_free(state: NodeState) -> tuple[tuple[int, int], ...]:
    """(GPUs in a partition, how many of those partitions have every GPU free), largest first:
    the node's partition table (an NVSwitch board's NVLink partitions) where it has one, else its
    NVLink domains."""
    inv = state.inventory
    if inv is None:
        return ()
    free = GPUSummary.of(state).whole_mask
    counts: dict[int, int] = {}
    if inv.partitions:
        for size, groups in inv.partitions.items():
            masks = {mask for group in groups for _, mask in group.partitions}
            counts[size] = sum(1 for mask in masks if mask & free == mask)
    else:
        for mask in inv.nvlink_domains.values():
            size = mask.bit_count()
            counts[size] = counts.get(size, 0) + (mask & free == mask)
    return tuple(sorted(counts.items(), reverse=True))
