"""NVIDIA go-gpuallocator's 52 best-effort cases, on its three machine models, through the real
inventory and `allocate()`: topoalloc never takes a GPU set that the best-effort policy's own
score rates lower than the set that policy takes (tests/support/gpuallocator.py).

A sequence is checked twice: on our own node as our earlier answers left it (what a user sees),
and on the node as NVIDIA's answers left it (the policy's case as written)."""

from __future__ import annotations

from itertools import combinations

import pytest
import yaml

from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.node.inventory import build_inventory
from allocator.core.node.state import NodeState
from allocator.core.request.parse import pod_request
from apis.interconnect import SAME_NUMA, SAME_ROOT, SAME_SWITCH
from tests.agent.support import FIXTURES
from tests.core.nodes import use_gpus
from tests.core.pods import gpus, pod
from tests.support import gpuallocator as ga


def _node(model: ga.Model, taken: tuple[int, ...] = ()) -> NodeState:
    state = NodeState("n", build_inventory(ga.model_device(model), {}), {})
    for minor in taken:
        use_gpus(state, minor, key=f"t/taken-{minor}")
    return state


def _take(state: NodeState, count: int, name: str) -> tuple[int, ...]:
    got = allocate(state, pod_request(pod(gpus(count), name=name)))
    if not isinstance(got, Allocation):
        return ()
    state.add_pod(f"default/{name}", got.devices)
    return tuple(got.minors("gpu"))


def test_the_models_are_nvidias_relation_for_relation() -> None:
    assert ga.CASES == 52
    for model in ga.MODELS:
        for a, b in combinations(range(model.gpus), 2):
            assert model.relation(a, b) == ga.published_relation(model, a, b), (model.name, a, b)


def test_the_volta_model_is_the_dgx1_v100_fixture() -> None:
    """Pair by pair the same NVLinks, and the fixture's host relation is the model's."""
    fixture = build_inventory(
        yaml.safe_load((FIXTURES / "dgx1-v100" / "expected-device.yaml").read_text()), {}
    )
    model = build_inventory(ga.model_device(ga.DGX1_VOLTA), {})
    assert fixture.interconnect is not None and model.interconnect is not None
    assert fixture.interconnect.links == model.interconnect.links
    assert fixture.interconnect.pcie_values == model.interconnect.pcie_values
    tiers = {ga.SINGLE_SWITCH: SAME_SWITCH, ga.HOST_BRIDGE: SAME_ROOT}
    ic = fixture.interconnect
    for a, b in combinations(range(8), 2):
        relation = ga.DGX1_VOLTA.relation(a, b)
        if relation in tiers and ic.links[a][b] == 0:
            assert ic.tiers[a][b] == tiers[relation]
        elif relation in tiers:  # NVLink pairs keep their PCIe relation in the tie-break values only
            assert ic.tiers[a][b] == SAME_NUMA


@pytest.mark.parametrize("seq", ga.SEQUENCES, ids=lambda s: f"{s.model.name.split(' (')[0]}-{s.steps[0][0]}")
def test_never_a_set_the_best_effort_policy_scores_lower(seq: ga.Sequence) -> None:
    ours = _node(seq.model)
    theirs_taken: tuple[int, ...] = ()
    for i, (count, expected) in enumerate(seq.steps):
        mine = _take(ours, count, f"p{i}")
        on_theirs = _take(_node(seq.model, theirs_taken), count, "q")
        theirs_taken += expected
        want = ga.set_score(seq.model, expected)
        assert len(mine) == len(expected) and len(on_theirs) == len(expected), (i, mine, on_theirs)
        assert ga.set_score(seq.model, mine) >= want, (i, mine, expected)
        assert ga.set_score(seq.model, on_theirs) >= want, (i, on_theirs, expected)


@pytest.mark.parametrize("case", ga.CHOICES, ids=lambda c: c.description)
def test_choices_among_given_free_gpus(case: ga.Choice) -> None:
    state = _node(case.model, tuple(g for g in range(case.model.gpus) if g not in case.available))
    got = _take(state, case.size, "c")
    assert len(got) == case.size
    assert ga.set_score(case.model, got) >= ga.set_score(case.model, case.expected), got


def test_a_dgx1_pascal_pair_shares_a_pcie_switch() -> None:
    """The issue's case: every NVLink pair has one link, so the pair behind one switch wins."""
    state = _node(ga.DGX1_PASCAL)
    assert [_take(state, 2, f"p{i}") for i in range(4)] == [(0, 2), (1, 3), (4, 6), (5, 7)]
