"""Ranking the feasible nodes for one pod, and kube-scheduler's 0..10 extender scale.

Nodes are ordered by the scorer's fine score (0..100, higher first); equal scores go to a stable
per-node key, a keyed hash of the node name. Stable matters: trace replay shows that breaking
ties randomly per pod (what kube-scheduler does among equal totals) leaves about twice as much GPU
capacity unallocated as a fixed order, because a fixed order keeps filling the same nodes and
leaves the others whole.

The extender's answer keeps that order: the best node alone gets 10, every other node at most 9
(its fine score rounded to 0..10, capped at 9). kube-scheduler adds `score × weight × 10` per
extender, so with a dominant extender weight it picks our best node, whatever its own plugins add.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

from allocator.core.scoring.scorer import MAX_PRIORITY, to_priority


def tie_key(name: str, seed: int = 0) -> int:
    """A 64-bit key of the node name, fixed for a given seed (not Python's salted `hash`)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8, key=str(seed).encode())
    return int.from_bytes(digest.digest(), "big")


def ranked(fine: Mapping[str, float], tie: Callable[[str], int]) -> list[str]:
    """Names best first: higher fine score, then lower tie key."""
    return sorted(fine, key=lambda name: (-fine[name], tie(name)))


def best(fine: Mapping[str, float], tie: Callable[[str], int]) -> str | None:
    """The first of `ranked` without sorting the rest; None for no nodes."""
    if not fine:
        return None
    top = max(fine.values())
    leaders = [name for name, score in fine.items() if score == top]
    return leaders[0] if len(leaders) == 1 else min(leaders, key=tie)


def extender_priorities(fine: Mapping[str, float], tie: Callable[[str], int]) -> dict[str, int]:
    """0..10 per node: 10 for the `best` node, its fine score on 0..10 capped at 9 for every other
    (so the order among the others is kept, and no sort is needed)."""
    top = best(fine, tie)
    cap = MAX_PRIORITY - 1
    out = {name: min(cap, to_priority(score)) for name, score in fine.items()}
    if top is not None:
        out[top] = MAX_PRIORITY
    return out
