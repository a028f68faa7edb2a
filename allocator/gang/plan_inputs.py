"""What the gang controller hands the core's gang planner, read from the watch cache: the
members' requests, the nodes every member tolerates, and where their siblings already are."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from allocator.gang.index import GangIndex, MemberPod
from allocator.gang.taints import admits, tolerations_of
from allocator.service.cache.store import ClusterCache
from allocator.service.coreadapter import PodRequest

JSON = dict[str, Any]


def member_requests(cache: ClusterCache, members: list[MemberPod]) -> list[PodRequest]:
    """The parsed request of each member the cache has in the version the index saw."""
    out = []
    for m in members:
        entry = cache.pods.get(m.key)
        if entry is not None and entry.raw is not None and entry.uid == m.uid:
            out.append(cache.core.request(entry.raw))
    return out


def admitting_nodes(cache: ClusterCache, members: list[MemberPod]) -> list[str]:
    """Nodes whose taints and cordon every one of the members tolerates."""
    kinds: dict[str, list[JSON]] = {}
    for m in members:
        entry = cache.pods.get(m.key)
        tolerations = tolerations_of(entry.raw) if entry is not None and entry.raw is not None else []
        kinds[json.dumps(tolerations, sort_keys=True)] = tolerations
    core = cache.core.cluster.nodes
    return [
        name
        for name, (_, _, spec) in cache.nodes.items()
        if name in core and all(admits(spec, t) for t in kinds.values())
    ]


def sibling_nodes(
    cache: ClusterCache, index: GangIndex, gang: str, members: list[MemberPod]
) -> dict[str, int]:
    """node -> how many siblings of the members (their gang `gang`, their job groups), the
    members themselves left out, hold or reserve room there."""
    where = cache.core.cluster.pod_node
    keys_ = set()
    for m in members:
        keys_ |= set(index.siblings(m.key, gang, m.job_key))
    keys_ -= {m.key for m in members}
    return dict(Counter(n for n in (where.get(k) for k in keys_) if n))
