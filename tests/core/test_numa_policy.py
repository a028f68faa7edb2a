"""The allocator's emulation of kubelet's Topology Manager merge (allocator/core/devices/numa_policy.py)
agrees with the stand-in kubelet's (tests/support/topology_manager.py, written from kubelet's source)
on any hints, under each policy; plus cases kubelet's own documentation walks through."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.core.devices import numa_policy as ours
from tests.support import topology_manager as kubelet

PROPS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
POLICIES = ("best-effort", "restricted", "single-numa-node")


@st.composite
def providers(draw: st.DrawFn) -> tuple[tuple[int, ...], list[list[ours.Hint]]]:
    nodes = tuple(range(draw(st.integers(1, 4))))
    full = (1 << len(nodes)) - 1
    hint = st.one_of(
        st.builds(ours.Hint, st.integers(1, full), st.booleans()),
        st.builds(ours.Hint, st.none(), st.booleans()),
    )
    return nodes, draw(st.lists(st.lists(hint, min_size=1, max_size=4), min_size=1, max_size=4))


@PROPS
@given(providers(), st.sampled_from(POLICIES))
def test_the_merge_is_kubelets(case: tuple[tuple[int, ...], list[list[ours.Hint]]], policy: str) -> None:
    nodes, hints = case
    got, admitted = ours.merge(policy, nodes, hints)
    theirs = [{f"r{i}": [kubelet.Hint(h.mask, h.preferred) for h in hs]} for i, hs in enumerate(hints)]
    want, want_admitted = kubelet.merge(policy, list(nodes), theirs)
    assert (got.mask, got.preferred, admitted) == (want.mask, want.preferred, want_admitted)


def H(mask: int | None, preferred: bool) -> ours.Hint:
    return ours.Hint(mask, preferred)


@pytest.mark.parametrize(
    ("policy", "hints", "mask", "admitted"),
    [
        # one GPU free on either node, CPUs only on node 1: node 1
        ("single-numa-node", [[H(1, True), H(2, True), H(3, False)], [H(2, True), H(3, False)]], 2, True),
        # GPUs on both, no preference from the CPUs: the lower node
        ("single-numa-node", [[H(1, True), H(2, True), H(3, False)], [H(None, True)]], 1, True),
        # 8 GPUs need both nodes: never under single-numa-node
        ("single-numa-node", [[H(3, True)]], None, False),
        # ... admitted under restricted when nothing else disagrees
        ("restricted", [[H(3, True)]], 3, True),
        # ... but not next to one NIC, whose narrowest mask is one node
        ("restricted", [[H(3, True)], [H(1, True), H(2, True), H(3, False)]], 3, False),
        # best-effort admits it anyway, on that merge (both nodes: the widest narrowest mask)
        ("best-effort", [[H(3, True)], [H(1, True), H(2, True), H(3, False)]], 3, True),
    ],
)
def test_documented_cases(
    policy: str, hints: list[list[ours.Hint]], mask: int | None, admitted: bool
) -> None:
    got, ok = ours.merge(policy, (0, 1), hints)
    assert (got.mask, ok) == (mask, admitted)
