"""Ranking with a stable tie-break, the extender's 0..10 answer, and a bind that takes the GPU the
score assumed."""

from __future__ import annotations

from allocator.core.cluster.ranking import best, extender_priorities, ranked, tie_key
from allocator.core.cluster.state import ClusterState
from allocator.core.request.parse import pod_request
from allocator.core.scoring.scorer import NodeScorer, ScoringConfig
from tests.core.nodes import CORE, RATIO, use_gpus
from tests.core.pods import gpus, pod
from tests.support.machines import l40s_device

SHARE_30 = {CORE: "30", RATIO: "30", "cpu": "2"}
FRAG_ONLY = {"weights": {"fit": 0, "scarce": 0, "topology": 0, "fragmentation": 1}}
PRIOR = {
    "prior": [{"cpu": "2", "gpuShare": 30, "gpus": 1, "weight": 1}, {"cpu": "8", "gpus": 1, "weight": 1}]
}


def node(name: str) -> dict:
    return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": "64", "memory": "256Gi"}}}


def l40s_cluster(names: list[str], seed: int = 0) -> ClusterState:
    c = ClusterState(tie_seed=seed)
    for name in names:
        c.upsert_node(node(name))
        c.set_device(l40s_device(name))
    return c


def test_tie_keys_are_stable_and_seeded() -> None:
    assert tie_key("node-a") == tie_key("node-a") == tie_key("node-a", 0)
    assert tie_key("node-a", 1) != tie_key("node-a", 2)
    names = [f"n{i}" for i in range(50)]
    fine = dict.fromkeys(names, 50.0)
    by_seed = [ranked(fine, lambda n, s=s: tie_key(n, s)) for s in (1, 2)]
    assert by_seed[0] != by_seed[1]  # each seed is a different fixed order
    assert by_seed[0] == ranked(fine, lambda n: tie_key(n, 1))
    assert best(fine, lambda n: tie_key(n, 1)) == by_seed[0][0]


def test_rank_orders_by_fine_score_then_tie_key() -> None:
    fine = {"a": 40.0, "b": 70.5, "c": 70.5, "d": 10.0}
    ties = {"a": 1, "b": 9, "c": 3, "d": 0}
    assert ranked(fine, ties.__getitem__) == ["c", "b", "a", "d"]
    assert best(fine, ties.__getitem__) == "c" and best({}, ties.__getitem__) is None


def test_only_the_best_node_gets_10() -> None:
    fine = {"c": 100.0, "b": 100.0, "a": 96.0, "d": 12.0, "e": 0.0}
    ties = {"a": 0, "b": 2, "c": 1, "d": 3, "e": 4}
    assert extender_priorities(fine, ties.__getitem__) == {"c": 10, "b": 9, "a": 9, "d": 1, "e": 0}
    assert extender_priorities({}, ties.__getitem__) == {}


def test_cluster_ranking_is_deterministic_and_priorities_follow_it() -> None:
    names = [f"gpu-{i}" for i in range(8)]
    req = pod_request(pod(gpus(1, cpu="4")))
    scorer = NodeScorer()
    one, two = l40s_cluster(names, seed=7), l40s_cluster(list(reversed(names)), seed=7)
    order = one.rank(req, names, scorer)
    assert order == two.rank(req, names, scorer)  # the node list's order does not matter
    assert order == sorted(names, key=one.tie_key)  # identical idle nodes: the tie key decides
    assert one.best(req, names, scorer) == order[0]
    prio = one.priorities(req, [*names, "ghost"], scorer)
    assert prio[order[0]] == 10 and all(prio[n] <= 9 for n in order[1:]) and prio["ghost"] == 0
    assert l40s_cluster(names, seed=8).rank(req, names, scorer) != order


def test_a_better_node_outranks_the_tie_order() -> None:
    names = ["a", "b", "c"]
    c = l40s_cluster(names)
    scorer = NodeScorer(ScoringConfig.from_dict({**FRAG_ONLY, "fragmentation": PRIOR}))
    req = pod_request(pod(SHARE_30))
    last = c.rank(req, names, scorer)[-1]
    use_gpus(c.nodes[last], 5, share=60)  # a GPU with 40% free: the 30% share packs into it
    order = c.rank(req, names, scorer)
    assert order[0] == last
    prio = c.priorities(req, names, scorer)
    assert prio[last] == 10 and max(prio[n] for n in names if n != last) <= 9


def test_bind_takes_the_gpu_the_fragmentation_term_scored() -> None:
    c = l40s_cluster(["l1"])
    use_gpus(c.nodes["l1"], 5, share=60)
    scorer = NodeScorer(ScoringConfig.from_dict({"fragmentation": PRIOR}))
    req = pod_request(pod(SHARE_30))
    assert scorer.preferred_gpus(c.nodes["l1"], req) == (5,)
    device_scoring = scorer.config.device_scoring  # Koordinator's default: LeastAllocated
    koordinator = c.allocate(req, "l1", device_scoring)
    ours = c.allocate(req, "l1", device_scoring, scorer=scorer)
    assert koordinator.minors("gpu") == [4]  # same PCIe switch as the used GPU, the emptier one
    assert ours.minors("gpu") == [5] and ours.path == "preferred"
    # whole GPUs keep the topology choice: any fully free GPU leaves the same fragmentation
    two = pod_request(pod(gpus(2, cpu="2")))
    assert scorer.preferred_gpus(c.nodes["l1"], two) is None
    assert c.allocate(two, "l1", device_scoring, scorer=scorer).minors("gpu") == c.allocate(
        two, "l1", device_scoring
    ).minors("gpu")


def test_assign_with_the_request_feeds_the_learned_mix() -> None:
    c = l40s_cluster(["l1"])
    scorer = NodeScorer(ScoringConfig.from_dict({**FRAG_ONLY, "fragmentation": {"refreshEvery": 1}}))
    c.add_observer(scorer.observe)
    req = pod_request(pod(SHARE_30, name="a"))
    assert scorer.breakdown(c.nodes["l1"], req) == {}  # nothing learned yet: the term abstains
    placed = c.allocate(req, "l1", scorer=scorer)
    c.assign("default/a", "l1", placed.devices, req.cpu_milli, req.memory, request=req)
    c.assign("default/x", "l1", None, 1000)  # replayed from the watch: not observed
    key = scorer.key
    assert c.score(req, ["l1"], scorer)["l1"] > 0
    assert scorer.key != key  # the mix changed, so cached scores were dropped
    (shape,) = scorer.components["fragmentation"].mix().shapes
    assert (shape.cpu_milli, shape.gpu_pct, shape.gpu_count) == (2000, 30, 1)


def test_cluster_rank_is_ranked_over_the_fine_scores() -> None:
    names = [f"gpu-{i}" for i in range(12)]
    c = l40s_cluster(names, seed=3)
    scorer = NodeScorer(ScoringConfig.from_dict({**FRAG_ONLY, "fragmentation": PRIOR}))
    for i, name in enumerate(names[:6]):
        use_gpus(c.nodes[name], 1 + i % 3, share=60)  # some scores differ, some tie
    req = pod_request(pod(SHARE_30))
    asked = [*reversed(names), "ghost"]
    want = ranked(c.fine_scores(req, asked, scorer), c.tie_key)
    assert c.rank(req, asked, scorer) == want and "ghost" not in want
    assert len(set(c.fine_scores(req, asked, scorer).values())) > 1  # not all one tie
    assert c.rank(req, [*asked, names[0]], scorer) == want  # a name twice: once, in its place
