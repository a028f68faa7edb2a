"""Topology quality of the GPUs a multi-GPU pod would get on a node.

Tiers, best first: all GPUs in one NVLink domain (100), behind one PCIe switch (75), on one NUMA
node (50), on one socket (25), spread across sockets (0). Computed from the node's bitmasks: the
best tier that the free GPUs allow, which is the set the allocator prefers (an NVLink domain
first, then the deepest scope). Single-GPU and shared requests are not ranked (None).
"""

from __future__ import annotations

from allocator.core.inventory import LEVEL_NUMA, LEVEL_PCIE
from allocator.core.request import PodRequest
from allocator.core.state import NodeState

NVLINK, PCIE, NUMA, SOCKET, CROSS = 100, 75, 50, 25, 0


def topology_score(state: NodeState, req: PodRequest) -> float | None:
    g = req.gpu
    inv = state.inventory
    if g is None or g.count < 2 or g.shared or inv is None:
        return None
    feasible = state.gpu_fit_mask(g.per_gpu)
    count = g.count
    if any((feasible & mask).bit_count() >= count for mask in inv.nvlink_domains.values()):
        return NVLINK
    for level, tier in ((LEVEL_PCIE, PCIE), (LEVEL_NUMA, NUMA)):
        if any((feasible & s.mask).bit_count() >= count for s in inv.scopes_by_level.get(level, ())):
            return tier
    if any((feasible & mask).bit_count() >= count for mask in inv.sockets.values()):
        return SOCKET
    return CROSS
