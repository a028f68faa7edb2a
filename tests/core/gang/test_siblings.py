"""Sibling affinity tiers and how they mix into the extender's 0..10 scores."""

from __future__ import annotations

import pytest

from allocator.core.gang.siblings import blend, shared_domain, sibling_affinity
from allocator.core.node.state import NodeState

RACK, ZONE = "topoalloc.io/rack", "topology.kubernetes.io/zone"
KEYS = (RACK, ZONE)


def nodes() -> dict[str, NodeState]:
    layout = {"a": ("r1", "z1"), "b": ("r1", "z1"), "c": ("r2", "z1"), "d": ("r3", "z2"), "e": (None, None)}
    out = {}
    for name, (rack, zone) in layout.items():
        labels = {k: v for k, v in ((RACK, rack), (ZONE, zone)) if v is not None}
        out[name] = NodeState(name, None, labels)
    return out


def test_tiers_node_then_rack_then_zone() -> None:
    got = sibling_affinity(nodes(), ["a", "b", "c", "d", "e", "ghost"], {"a": 3}, KEYS)
    assert got == pytest.approx({"a": 100, "b": 200 / 3, "c": 100 / 3, "d": 0, "e": 0, "ghost": 0})


def test_no_siblings_no_opinion() -> None:
    assert sibling_affinity(nodes(), ["a", "b"], {}, KEYS) == {}
    assert sibling_affinity(nodes(), ["a", "b"], {"a": 0}, KEYS) == {}


def test_a_higher_tier_outranks_any_score_of_a_lower_one_with_weight_3() -> None:
    affinity = sibling_affinity(nodes(), ["a", "b", "c", "d"], {"a": 1}, KEYS)
    # The scorer prefers them in the opposite order; the tiers still decide.
    mixed = blend({"a": 0, "b": 30, "c": 60, "d": 100}, affinity, 3.0)
    assert mixed == pytest.approx({"a": 75, "b": 57.5, "c": 40, "d": 25})
    # Within one tier the scorer's order stays.
    assert blend({"a": 20, "b": 90}, {"a": 100, "b": 100}, 3.0) == pytest.approx({"a": 80, "b": 97.5})
    assert blend({"a": 20}, affinity, 0) == {"a": 20}


def test_shared_domain_names_the_narrowest_common_label() -> None:
    ns = nodes()
    assert shared_domain([ns["a"], ns["b"]], KEYS) == (0, f"{RACK}=r1")
    assert shared_domain([ns["a"], ns["c"]], KEYS) == (1, f"{ZONE}=z1")
    assert shared_domain([ns["a"], ns["d"]], KEYS) == (2, "")
    assert shared_domain([ns["e"], ns["e"]], KEYS) == (2, "")
    assert shared_domain([ns["d"]], KEYS) == (0, "")
