"""The column caches decide exactly as the per-node functions do.

`ClusterState` answers filter and prioritize from numpy columns that group nodes in the same
state and forget only the nodes changed since they were last read. These properties build random
clusters whose nodes share machine types but differ in name, device ids and Device labels (what
the grouping must ignore), place and remove pods between questions, and hold every answer to
`allocate.fits` and `NodeScorer.fine_prepared` evaluated node by node on the same states.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.core.cluster.state import UNKNOWN_NODE, ClusterState
from allocator.core.devices.allocate import Allocation, fits
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from allocator.core.scoring.scorer import NodeScorer, ScoringConfig, to_priority
from tests.core.test_properties import devices, pods

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Memory requests make the fragmentation score read free memory, and the H100-only shape makes
# it read the model pressure (idle GPU per model over the whole cluster): a grouping or memo key
# that missed either, or a pressure change that left cached columns alone, shows up here.
PRIOR = {
    "prior": [
        {"cpu": "2", "gpuShare": 30, "gpus": 1, "weight": 2},
        {"cpu": "4", "memory": "100Gi", "gpuShare": 50, "gpus": 1, "weight": 1},
        {"cpu": "8", "memory": "300Gi", "gpus": 1, "models": ["H100"], "weight": 2},
        {"cpu": "16", "gpus": 4, "weight": 1},
    ]
}
CONFIGS = (
    None,  # the default weights
    {
        "weights": {"fit": 1, "scarce": 1, "topology": 1, "fragmentation": 1, "device": 1},
        "fragmentation": PRIOR,
    },
    {"weights": {"fit": 0, "scarce": 0, "topology": 0, "fragmentation": 1}, "fragmentation": PRIOR},
)


def _node_copy(template: dict[str, Any], name: str, variant: int) -> dict[str, Any]:
    """The template machine under another name, with its own device ids and a Device label the
    allocator does not read: equal for the grouping, different objects and strings."""
    device = copy.deepcopy(template)
    device["metadata"]["name"] = name
    device["metadata"]["labels"]["rack"] = f"r{variant}"
    for dev in device["spec"]["devices"]:
        dev["id"] = f"{dev['id']}-{name}"
    return device


def _with_cpu(pod: dict[str, Any], cpu: str) -> dict[str, Any]:
    for c in pod["spec"]["containers"]:
        c["resources"]["requests"]["cpu"] = cpu
        c["resources"]["limits"]["cpu"] = cpu
    return pod


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterState, list[str]]:
    templates = [draw(devices()) for _ in range(draw(st.integers(1, 3)))]
    cluster = ClusterState(tie_seed=draw(st.integers(0, 3)))
    names = [f"node-{i}" for i in range(draw(st.integers(2, 9)))]
    for i, name in enumerate(names):
        template = templates[draw(st.integers(0, len(templates) - 1))]
        cpu = draw(st.sampled_from(("16", "64", "128")))
        memory = draw(st.sampled_from(("256Gi", "512Gi")))
        node = {"metadata": {"name": name}, "status": {"allocatable": {"cpu": cpu, "memory": memory}}}
        cluster.upsert_node(node)
        cluster.set_device(_node_copy(template, name, i % 2))
    return cluster, names


def _place(cluster: ClusterState, name: str, req: PodRequest, key: str, cpu_milli: int, memory: int) -> bool:
    got = cluster.allocate(req, name)
    if not isinstance(got, Allocation):
        return False
    cluster.assign(key, name, got.devices, cpu_milli, memory, request=req)
    return True


def _check(cluster: ClusterState, scorer: NodeScorer, req: PodRequest, names: list[str]) -> None:
    asked = [*names, "no-such-node"]
    passed, failed = cluster.feasible(req, asked)
    expected = {n: fits(cluster.nodes[n], req) for n in names}
    assert passed == [n for n in names if expected[n] is None]
    assert failed == {**{n: r for n, r in expected.items() if r is not None}, "no-such-node": UNKNOWN_NODE}

    scorer.sync(cluster.table)  # as ClusterState does: the learned mix or model pressure may have moved
    prepared = scorer.prepare(req)
    fine = {n: NodeScorer.fine_prepared(cluster.nodes[n], prepared) for n in names}
    assert cluster.fine_scores(req, asked, scorer) == fine
    assert cluster.score(req, asked, scorer) == {
        **{n: to_priority(f) for n, f in fine.items()},
        "no-such-node": 0,
    }
    ranked = sorted(names, key=lambda n: (-fine[n], cluster.tie_key(n)))
    assert cluster.rank(req, asked, scorer) == ranked
    assert cluster.best(req, asked, scorer) == ranked[0]
    prios = cluster.priorities(req, asked, scorer)
    assert prios[ranked[0]] == 10 and prios["no-such-node"] == 0
    assert all(prios[n] == min(to_priority(fine[n]), 9) for n in ranked[1:])


@PROPS
@given(
    world=clusters(),
    config=st.sampled_from(CONFIGS),
    steps=st.lists(
        st.tuples(pods(), st.sampled_from(("1", "4", "30")), st.integers(0, 3), st.sampled_from((1, 200))),
        min_size=1,
        max_size=6,
    ),
)
def test_columns_equal_the_per_node_answers_as_pods_come_and_go(
    world: tuple[ClusterState, list[str]], config: dict[str, Any] | None, steps: list[Any]
) -> None:
    cluster, names = world
    scorer = NodeScorer(ScoringConfig.from_dict(config))
    cluster.add_observer(scorer.observe)
    placed: list[str] = []
    for i, (pod, cpu, action, memory_gib) in enumerate(steps):
        req = pod_request(_with_cpu(pod, cpu))
        _check(cluster, scorer, req, names)
        _check(cluster, scorer, req, names[::-1])  # asked again, in another order: from the columns
        if action == 0 and placed:
            cluster.unassign(placed.pop(0))
        elif action in (1, 2):
            target = cluster.best(req, names, scorer) if action == 1 else names[i % len(names)]
            if target is not None and _place(
                cluster, target, req, f"ns/p{i}", int(float(cpu) * 1000), memory_gib * 2**30
            ):
                placed.append(f"ns/p{i}")
        # the same shape again after the change: only the changed node may be recomputed
        _check(cluster, scorer, req, names)


@PROPS
@given(world=clusters(), pod=pods())
def test_a_node_removed_or_relabelled_is_answered_afresh(
    world: tuple[ClusterState, list[str]], pod: dict
) -> None:
    cluster, names = world
    scorer = NodeScorer(ScoringConfig.from_dict(CONFIGS[1]))
    req = pod_request(_with_cpu(pod, "4"))
    _check(cluster, scorer, req, names)
    cluster.remove_node(names[0])
    _, failed = cluster.feasible(req, names)
    assert failed[names[0]] == UNKNOWN_NODE
    _check(cluster, scorer, req, names[1:])
    node = {
        "metadata": {"name": names[-1], "labels": {"topology.kubernetes.io/zone": "z9"}},
        "status": {"allocatable": {"cpu": "2", "memory": "4Gi"}},
    }
    cluster.upsert_node(node)
    _check(cluster, scorer, req, names[1:])
