"""The room a GPU model keeps for the pods held to it (allocator/core/scoring/gang_room.py): the
gangs it learns from placed pods, the room counted in units of their member size, and the scorer
rescoring when the room could change an answer."""

from __future__ import annotations

from allocator.core.cluster.state import ClusterState
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from allocator.core.scoring import gang_room
from allocator.core.scoring.fragmentation_term import FragmentationSettings, FragmentationTerm
from allocator.core.scoring.gang_room import GangRoom
from allocator.core.scoring.scorer import NodeScorer, ScoringConfig
from allocator.core.scoring.topology import NVLINK
from allocator.core.scoring.workload_mix import TaskShape
from apis import keys
from tests.core.nodes import cluster_of
from tests.core.pods import gpus, pod
from tests.support.machines import dgx_h100_device, l40s_device

H100 = "H100-80GB-HBM3"


def _member(gang: str, i: int, count: int, model: str | None = H100) -> PodRequest:
    obj = pod(gpus(count, cpu="8"), name=f"{gang}-{i}", labels={keys.POD_GROUP_LABEL: gang})
    if model:
        obj["spec"]["nodeSelector"] = {keys.GPU_MODEL: model}
    return pod_request(obj)


def _cluster(dgx: int, l40s: int = 2) -> ClusterState:
    docs = [dgx_h100_device(f"h{i}") for i in range(dgx)] + [l40s_device(f"l{i}") for i in range(l40s)]
    return cluster_of(*docs, cpu="224", memory="2000Gi")


def _take(cluster: ClusterState, node: str, count: int, key: str) -> None:
    """Count a pod of `count` whole GPUs on `node` (the devices the core would choose)."""
    req = pod_request(pod(gpus(count), name=key))
    alloc = cluster.allocate(req, node, None)
    cluster.assign(f"default/{key}", node, alloc.devices, 0, 0)  # type: ignore[union-attr]


def test_a_gang_held_to_a_model_is_learned_from_its_distinct_members() -> None:
    room = GangRoom()
    for i in (0, 1, 1, 2, 3):  # a member seen twice (re-bound) counts once
        room.observe(_member("dp", i, 4))
    room.observe(_member("pre", 0, 8))
    room.observe(_member("pre", 1, 8))
    room.observe(_member("any", 0, 8, model=None))  # may run anywhere: holds no room
    solo = pod_request(pod(gpus(2), name="solo"))  # not in a gang
    room.observe(solo)
    assert room.needs(()) == {H100: {4: 4, 8: 2}}
    # a constrained whole-GPU shape of the mix is a group of one; shares hold no room
    mix = (
        TaskShape(8000, 100, 2, ("A100",)),
        TaskShape(8000, 100, 8, (H100,)),
        TaskShape(8000, 50, 1, ("L4",)),
    )
    assert room.needs(mix) == {H100: {4: 4, 8: 2}, "A100": {2: 1}}


def test_old_gangs_stop_holding_room() -> None:
    room = GangRoom()
    room.observe(_member("old", 0, 8))
    for g in range(gang_room.GANGS_REMEMBERED):
        room.observe(_member(f"g{g}", 0, 2))
    assert room.needs(()) == {H100: {2: 1}}


def test_room_is_counted_in_units_of_the_member_size() -> None:
    """Four DGX H100: a learned 2 x 8 gang needs two whole nodes, a 4 x 4 gang four halves."""
    cluster = _cluster(4)
    h = [cluster.nodes[f"h{i}"] for i in range(4)]
    room = GangRoom()
    two_by_eight = {H100: {8: 2}}
    assert room.keeps_room(h[0], 8, two_by_eight)  # three whole nodes left
    _take(cluster, "h0", 8, "a")
    assert room.keeps_room(h[1], 8, two_by_eight)  # two left
    assert room.keeps_room(h[1], 2, two_by_eight)
    _take(cluster, "h1", 2, "b")  # h1 is no longer whole
    assert not room.keeps_room(h[2], 2, two_by_eight)  # would leave one whole node
    assert room.keeps_room(h[1], 6, two_by_eight)  # h1 counts for nothing already
    four_by_four = {H100: {4: 4}}
    # halves: h1 has 6 free (one half), h2 and h3 two each = 5
    assert room.keeps_room(h[1], 2, four_by_four)  # 6 -> 4 free: still one half
    assert room.keeps_room(h[2], 4, four_by_four)  # 5 -> 4
    _take(cluster, "h2", 4, "c")
    assert not room.keeps_room(h[3], 2, four_by_four)  # 8 -> 6 free: a half lost, 3 left
    assert room.keeps_room(cluster.nodes["l0"], 8, four_by_four)  # other models keep nothing


def test_the_scorer_rescores_when_the_room_runs_out() -> None:
    """A learned 2 x 8 H100 gang and three DGX: the first unconstrained 8-GPU pod gets its NVLink
    credit (two whole DGX stay); after that the next one would take the room, and the cached
    score must not survive the change. The model pressure stays 1.0 throughout (the mix is mostly
    H100-only), so only the room can tell the scorer that its cached scores are stale."""
    h100_only = TaskShape(8000, 100, 8, (H100,))
    term = FragmentationTerm(FragmentationSettings(prior=((h100_only, 10.0), (TaskShape(8000, 100, 8), 1.0))))
    scorer = NodeScorer(ScoringConfig(), components={"fragmentation": term})
    cluster = _cluster(3)
    cluster.add_observer(scorer.observe)
    for i in range(2):
        req = _member("pre", i, 8)
        alloc = cluster.allocate(req, f"h{i}", None)
        cluster.assign(f"default/pre-{i}", f"h{i}", alloc.devices, 0, 0, request=req)  # type: ignore[union-attr]
    for i in range(2):
        cluster.unassign(f"default/pre-{i}")  # the gang left; its size is remembered
    assert term.needs()[H100] == {8: 2}
    anywhere = pod_request(pod(gpus(8, cpu="8"), name="anywhere"))
    names = list(cluster.nodes)
    first = cluster.best(anywhere, names, scorer)
    assert first in ("h0", "h1", "h2")
    assert cluster.fine_scores(anywhere, [first], scorer)  # cached now
    assert scorer.breakdown(cluster.nodes[first], anywhere)["topology"] == NVLINK
    assert term.pressure(cluster.table)[H100] == 1.0
    _take(cluster, first, 8, "first")
    assert term.pressure(cluster.table)[H100] == 1.0
    second = cluster.best(anywhere, names, scorer)
    assert second in ("l0", "l1")
    other = next(n for n in ("h0", "h1", "h2") if n != first)
    assert scorer.breakdown(cluster.nodes[other], anywhere)["topology"] == 0.0


def test_the_room_decides_even_when_the_mix_has_forgotten_the_gangs_shapes() -> None:
    """Many unconstrained 1-GPU pods crowd the gang's H100-only shape out of the learned mix, so
    the fragmentation term sees no model pressure and scores a DGX and an L40S alike for an 8-GPU
    pod; the learned 2 x 8 gang still keeps its room, whatever the nodes are called (a tie would
    have gone to the node name's hash)."""
    for l40s in ("l0", "l1", "l2", "l3"):
        term = FragmentationTerm(FragmentationSettings())
        scorer = NodeScorer(ScoringConfig(), components={"fragmentation": term})
        docs = [dgx_h100_device(f"h{i}") for i in range(3)] + [l40s_device(l40s)]
        cluster = cluster_of(*docs, cpu="224", memory="2000Gi")
        for i in range(300):
            term.observe(pod_request(pod(gpus(1, cpu="1"), name=f"small-{i}")))
        for i in range(2):
            term.observe(_member("pre", i, 8))
        assert term.needs() == {H100: {8: 2}}
        assert not term.pressure(cluster.table).get(H100)  # the mix alone would not steer
        anywhere = pod_request(pod(gpus(8, cpu="8"), name="anywhere"))
        _take(cluster, "h0", 8, "first")  # two whole DGX left: exactly the gang's room
        assert cluster.best(anywhere, list(cluster.nodes), scorer) == l40s
