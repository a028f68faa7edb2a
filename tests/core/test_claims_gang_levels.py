"""A gang of claims keeps to its topology level as every other gang does (allocator/core/claims/
gang.py over core/gang/levels.py): with a required rack, two 8-GPU members land in one rack or the
gang waits, saying so; a preferred rack is kept where one has room. And a pod whose claims are
allocated is held to their node (`pinned`), as kube-scheduler holds it."""

from __future__ import annotations

from allocator.core.claims.gang import pinned, place_gang
from allocator.core.claims.place import NoPlacement
from allocator.core.cluster.state import ClusterState, affinity_matches
from allocator.core.gang.levels import levels_of
from allocator.core.gang.plan import GangPlanSettings
from allocator.core.request.parse import pod_request
from allocator.core.scoring.scorer import NodeScorer, ScoringConfig
from apis.topology_constraint import TopologyWish
from apis.topology_profile import GENERIC, RACK
from tests.core.pods import pod
from tests.core.test_claims_solve import fixture_device, member, published

REQUIRED = levels_of(GENERIC, TopologyWish(required="rack"))
PREFERRED = levels_of(GENERIC, TopologyWish(preferred="rack"))
SETTINGS = GangPlanSettings(topology_keys=GENERIC.keys)
RACKS = {"a1": "r1", "a2": "r1", "b1": "r2", "b2": "r2"}


def racks() -> tuple[ClusterState, dict]:
    cluster = ClusterState()
    pools = {}
    for name, rack in RACKS.items():
        dev = fixture_device("dgx-h100", name)
        cluster.upsert_node(
            {
                "metadata": {"name": name, "labels": {RACK: rack}},
                "status": {"allocatable": {"cpu": "64", "memory": "1Ti", "pods": "110"}},
            }
        )
        cluster.set_device(dev)
        pools[name] = published(dev)
    return cluster, pools


def busy(cluster: ClusterState, pools: dict, node: str) -> None:
    """Eight GPUs of `node` taken by another claim."""
    (answer,) = place_gang(cluster, [member("x", 8)], [node], pools, NodeScorer(ScoringConfig()), SETTINGS)
    for key, usage in answer.usage.items():  # type: ignore[union-attr]
        cluster.assign(f"claim:{key}-{node}", node, usage)


def gang(cluster: ClusterState, pools: dict, levels=None) -> list | NoPlacement:
    names = sorted(RACKS)
    scorer = NodeScorer(ScoringConfig())
    return place_gang(cluster, [member("m0", 8), member("m1", 8)], names, pools, scorer, SETTINGS, levels)


def test_a_required_rack_keeps_the_gang_in_one_rack_or_it_waits() -> None:
    assert REQUIRED is not None and REQUIRED.required
    cluster, pools = racks()
    busy(cluster, pools, "a2")  # rack r1 has one free node: the gang must go to r2
    placed = gang(cluster, pools, REQUIRED)
    assert isinstance(placed, list) and sorted(a.node for a in placed) == ["b1", "b2"]
    busy(cluster, pools, "b2")  # a1 and b1 are free, in two racks: it waits, saying why
    waits = gang(cluster, pools, REQUIRED)
    assert isinstance(waits, NoPlacement)
    assert "does not fit whole: required rack (topoalloc.io/rack)" in waits.summary()
    spread = gang(cluster, pools)  # without the level it would take the two racks
    assert isinstance(spread, list) and sorted(a.node for a in spread) == ["a1", "b1"]
    preferred = gang(cluster, pools, PREFERRED)  # preferred: the best it can
    assert isinstance(preferred, list) and sorted(a.node for a in preferred) == ["a1", "b1"]


def test_a_preferred_rack_is_kept_where_one_has_room() -> None:
    cluster, pools = racks()
    busy(cluster, pools, "a2")
    placed = gang(cluster, pools, PREFERRED)
    assert isinstance(placed, list) and sorted(a.node for a in placed) == ["b1", "b2"]


def test_a_pod_with_allocated_claims_is_held_to_their_node() -> None:
    cluster, _ = racks()
    req = pinned(pod_request(pod({"cpu": "1"}, name="p")), "b1")
    assert [n for n in RACKS if affinity_matches(cluster.nodes[n], req)] == ["b1"]
    raw = pod({"cpu": "1"}, name="q")
    raw["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": RACK, "operator": "In", "values": ["r1"]}]}
                ]
            }
        }
    }
    both = pinned(pod_request(raw), "a2")  # its own affinity still holds as well
    assert [n for n in RACKS if affinity_matches(cluster.nodes[n], both)] == ["a2"]
    assert not any(affinity_matches(cluster.nodes[n], pinned(pod_request(raw), "b1")) for n in RACKS)
