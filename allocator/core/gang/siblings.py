"""Sibling affinity: pods of one RL job group (`rl-job-group` label) and members of one gang score
higher on nodes already hosting their siblings, then on nodes that share a topology-domain label
(rack, zone, ... in the configured order) with a node hosting one.

Tiers, 0..100: a node hosting a sibling 100; a node sharing the value of `keys[i]` with a sibling's
node `100 * (len(keys) - i) / (len(keys) + 1)`; any other node 0. With keys (rack, zone): 100,
66.7, 33.3, 0.

Siblings move without the scored node changing (a sibling lands elsewhere in the rack), so unlike
the scorer's components this is not cached per node version: it is computed per call from
`siblings`, a node -> sibling count map the caller keeps, in O(names + sibling nodes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from allocator.core.cluster.ranking import extender_priorities
from allocator.core.cluster.state import ClusterState
from allocator.core.node.state import NodeState
from allocator.core.request.pod_request import PodRequest
from allocator.core.scoring.scorer import NodeScorer

SAME_NODE = 100.0


def domain_values(
    nodes: Mapping[str, NodeState], names: Iterable[str], keys: Sequence[str]
) -> list[set[str]]:
    """Per key, the label values the named nodes carry (nodes without the label add nothing)."""
    out: list[set[str]] = [set() for _ in keys]
    for name in names:
        state = nodes.get(name)
        if state is None:
            continue
        for i, key in enumerate(keys):
            value = state.labels.get(key)
            if value is not None:
                out[i].add(value)
    return out


def shared_domain(states: Sequence[NodeState], keys: Sequence[str]) -> tuple[int, str]:
    """(index of the first key all the nodes carry with one value, "key=value"), or
    (len(keys), "") when none does. One node is its own domain: (0, "")."""
    if len(states) <= 1:
        return 0, ""
    for i, key in enumerate(keys):
        values = {s.labels.get(key) for s in states}
        if len(values) == 1 and None not in values:
            return i, f"{key}={values.pop()}"
    return len(keys), ""


def sibling_affinity(
    nodes: Mapping[str, NodeState], names: Iterable[str], siblings: Mapping[str, int], keys: Sequence[str]
) -> dict[str, float]:
    """0..100 per name (see the module docstring); empty when there are no siblings."""
    hosting = [n for n, count in siblings.items() if count > 0]
    if not hosting:
        return {}
    domains = domain_values(nodes, hosting, keys)
    steps = len(keys) + 1
    out: dict[str, float] = {}
    for name in names:
        if siblings.get(name, 0) > 0:
            out[name] = SAME_NODE
            continue
        value = 0.0
        state = nodes.get(name)
        if state is not None:
            for i, key in enumerate(keys):
                label = state.labels.get(key)
                if label is not None and label in domains[i]:
                    value = SAME_NODE * (len(keys) - i) / steps
                    break
        out[name] = value
    return out


def blend(fine: Mapping[str, float], affinity: Mapping[str, float], weight: float) -> dict[str, float]:
    """Fine scores (0..100) with the affinity mixed in as a weighted mean,
    `(fine + weight * affinity) / (1 + weight)`. With weight 3 (tiers 100 / 66.7 / 33.3 / 0 for
    two keys) a node of a higher tier never ranks below a node of a lower one, and nodes of one
    tier keep the scorer's order."""
    if not affinity or weight <= 0:
        return dict(fine)
    return {n: (f + weight * affinity.get(n, 0.0)) / (1 + weight) for n, f in fine.items()}


def sibling_priorities(
    cluster: ClusterState,
    req: PodRequest,
    names: Sequence[str],
    scorer: NodeScorer,
    siblings: Mapping[str, int],
    keys: Sequence[str],
    weight: float,
) -> dict[str, int]:
    """The extender's 0..10 answer for a pod with siblings: the scorer's fine scores blended with
    the affinity, then ranked like `ClusterState.priorities` (the best node alone at 10)."""
    fine = cluster.fine_scores(req, names, scorer)
    mixed = blend(fine, sibling_affinity(cluster.nodes, fine, siblings, keys), weight)
    out = extender_priorities(mixed, cluster.tie_key)
    return {name: out.get(name, 0) for name in names}
