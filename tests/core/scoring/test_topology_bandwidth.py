"""Node ranking and the gang planner rate GPU topology by the same pair bandwidth as the GPU set
chooser where NVLink differs between pairs, and an unconstrained pod gets no topology credit for
GPUs that pods held to the node's GPU model need (gang_room.py)."""

from __future__ import annotations

import yaml

from allocator.core.cluster.state import ClusterState
from allocator.core.gang.plan import GangPlan, plan_gang
from allocator.core.request.parse import pod_request
from allocator.core.scoring.fragmentation_term import FragmentationSettings, FragmentationTerm
from allocator.core.scoring.scorer import NodeScorer, ScoringConfig
from allocator.core.scoring.topology import (
    CROSS,
    NOT_SPOKEN_FLOOR,
    NUMA,
    NVLINK,
    PCIE,
    prepare_topology_grouped,
    topology_score,
)
from allocator.core.scoring.workload_mix import TaskShape
from apis import keys
from apis.annotations import DeviceAllocations
from tests.agent.support import FIXTURES
from tests.core.nodes import CORE, RATIO, cluster_of, state_of, use_gpus
from tests.core.pods import gpus, pod
from tests.support import gpuallocator as ga
from tests.support.allocations import entry
from tests.support.machines import dgx_h100_device, l40s_device

DGX1 = FIXTURES / "dgx1-v100" / "expected-device.yaml"


def _dgx1(name: str = "n") -> dict:
    doc = yaml.safe_load(DGX1.read_text())
    doc["metadata"]["name"] = name
    return doc


def _free_only(state: object, *free: int) -> object:
    use_gpus(state, *(m for m in range(8) if m not in free), key="ns/load")  # type: ignore[arg-type]
    return state


def test_on_a_dgx1_the_tier_follows_the_best_pair_the_chooser_would_take() -> None:
    two = pod_request(pod(gpus(2)))
    # every 2-GPU set is inside the one NVLink domain: the old rule gave all of them NVLINK
    assert topology_score(state_of(_dgx1()), two) == NVLINK  # two links, one switch (2-3)
    assert topology_score(_free_only(state_of(_dgx1()), 0, 3, 5), two) == NVLINK - 1 + 3 / 4  # 0-3: PHB
    single = topology_score(_free_only(state_of(_dgx1()), 0, 1), two)  # one link, same switch
    assert single == PCIE + (NVLINK - PCIE - 1) / 2 + 1
    # no NVLink between them, across the sockets
    assert topology_score(_free_only(state_of(_dgx1()), 0, 5), two) == CROSS
    assert NVLINK > single > PCIE > CROSS


def test_four_and_eight_gpus_on_a_dgx1_are_rated_by_their_weakest_pair() -> None:
    state = state_of(_dgx1())
    quad = topology_score(state, pod_request(pod(gpus(4))))
    assert PCIE < quad < NVLINK  # a socket's quad: every pair linked, the weakest by one link
    assert topology_score(state, pod_request(pod(gpus(8)))) == CROSS  # pairs without NVLink across sockets


def test_on_a_dgx1_pascal_the_pair_behind_one_switch_ranks_first() -> None:
    two = pod_request(pod(gpus(2)))
    behind_switch = topology_score(_free_only(state_of(ga.model_device(ga.DGX1_PASCAL)), 0, 2), two)
    across_bridge = topology_score(_free_only(state_of(ga.model_device(ga.DGX1_PASCAL)), 0, 1), two)
    assert behind_switch == NVLINK and across_bridge < NVLINK


def test_nodes_without_differing_nvlink_keep_the_domain_and_scope_tiers() -> None:
    two = pod_request(pod(gpus(2)))
    assert topology_score(state_of(dgx_h100_device()), two) == NVLINK  # NVSwitch: every pair equal
    l40s = state_of(l40s_device())
    assert topology_score(l40s, two) == PCIE  # no NVLink: the scopes (tests/core/test_scoring.py)
    use_gpus(l40s, 0, 2, 4, 6)
    assert topology_score(l40s, two) == NUMA


def test_the_gang_planner_takes_the_node_with_the_better_pair() -> None:
    """One 2-GPU member, two DGX-1 nodes: on "a" only a single-link pair is free, on "b" a
    double-link one. Both are one NVLink domain, which used to tie them (and "a" won by name)."""
    cluster = cluster_of(_dgx1("a"), _dgx1("b"))
    for name, free in (("a", (0, 1)), ("b", (0, 3))):
        busy = [entry(m, {CORE: 100, RATIO: 100}) for m in range(8) if m not in free]
        cluster.assign(f"ns/load-{name}", name, DeviceAllocations({"gpu": busy}), 0, 0)
    plan = plan_gang(cluster, [pod_request(pod(gpus(2), name="m0"))])
    assert isinstance(plan, GangPlan)
    assert plan.nodes == ("b",)
    assert plan.placements[0].allocation.minors("gpu") == [0, 3]


def test_spoken_for_gpus_give_unconstrained_pods_no_topology_credit() -> None:
    req = pod_request(pod(gpus(8)))
    state = state_of(dgx_h100_device())
    plain = prepare_topology_grouped(req)
    assert plain is not None and plain(state) == NVLINK
    asked: list[int] = []
    for spoken, want in ((False, NVLINK), (True, 0.0)):
        grouped = prepare_topology_grouped(req, lambda _s, count, v=spoken: asked.append(count) or v)
        assert grouped is not None and grouped(state) == want
    assert asked == [8, 8]  # the GPUs the pod would take
    # across sockets (CROSS, 0): while some model keeps room, a node not spoken for still ranks
    # above one that is; with no room kept anywhere (None) the tier stands as it is
    two = pod_request(pod(gpus(2)))
    split = state_of(l40s_device())
    use_gpus(split, 1, 2, 3, 4, 5, 6, key="ns/load")  # GPUs 0 and 7 free, one per socket
    assert prepare_topology_grouped(two)(split) == CROSS  # type: ignore[misc]
    for spoken, want in ((None, CROSS), (False, NOT_SPOKEN_FLOOR), (True, 0.0)):
        grouped = prepare_topology_grouped(two, lambda _s, _c, v=spoken: v)
        assert grouped is not None and grouped(split) == want


def _h100_cluster(dgx: int) -> ClusterState:
    return cluster_of(
        *(dgx_h100_device(f"h{i}") for i in range(1, dgx + 1)), l40s_device("l1"), l40s_device("l2")
    )


def test_an_unconstrained_8gpu_pod_leaves_a_spoken_for_dgx_to_the_gangs_that_need_it() -> None:
    """The learned mix says half the GPU demand can only run on H100 (8 GPUs a pod), and the
    cluster has one DGX H100 beside two 8x L40S: taking the DGX would leave the H100-only pods no
    room. An 8-GPU pod that may run anywhere goes to an L40S, while one constrained to H100 still
    gets the DGX (its tier counts in full). With a second DGX the room is kept either way, and the
    unconstrained pod gets its NVLink."""
    h100 = TaskShape(8000, 100, 8, ("H100-80GB-HBM3",))
    prior = ((h100, 1.0), (TaskShape(8000, 100, 8), 1.0))
    term = FragmentationTerm(FragmentationSettings(prior=prior))
    config = ScoringConfig()
    scorer = NodeScorer(config, components={"fragmentation": term})
    cluster = _h100_cluster(1)
    assert term.needs() == {"H100-80GB-HBM3": {8: 1}}  # the mix's H100-only shape: a group of one
    anywhere = pod_request(pod(gpus(8, cpu="8"), name="anywhere"))
    assert cluster.best(anywhere, list(cluster.nodes), scorer) in ("l1", "l2")
    assert scorer.breakdown(cluster.nodes["h1"], anywhere)["topology"] == 0.0
    h100_only = pod(gpus(8, cpu="8"), name="h100-only")
    h100_only["spec"]["nodeSelector"] = {keys.GPU_MODEL: "H100-80GB-HBM3"}
    constrained = pod_request(h100_only)
    assert scorer.breakdown(cluster.nodes["h1"], constrained)["topology"] == NVLINK
    # without the constrained demand the DGX's NVLink wins the unconstrained pod back
    free_for_all = FragmentationTerm(FragmentationSettings(prior=((TaskShape(8000, 100, 8), 1.0),)))
    scorer = NodeScorer(config, components={"fragmentation": free_for_all})
    assert cluster.best(anywhere, list(cluster.nodes), scorer) == "h1"
    # two DGX: one is left for the H100-only pods, so the other's NVLink counts
    two = _h100_cluster(2)
    term = FragmentationTerm(FragmentationSettings(prior=prior))
    scorer = NodeScorer(config, components={"fragmentation": term})
    assert scorer.breakdown(two.nodes["h1"], anywhere)["topology"] == NVLINK
    assert two.best(anywhere, list(two.nodes), scorer) in ("h1", "h2")
