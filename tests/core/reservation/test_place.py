"""Placing a Reservation with the pod's core (core/reservation/place.py) and the rooms' cpu and
memory kept from other pods (core/reservation/fit.py)."""

from __future__ import annotations

import json

from allocator.core.cluster.state import ClusterState
from allocator.core.reasons import Rejection
from allocator.core.request.parse import pod_request
from allocator.core.reservation.fit import short_of_rooms
from allocator.core.reservation.place import NoRoom, RoomPlan, place
from allocator.core.reservation.room import room_key
from allocator.core.scoring.scorer import NodeScorer, ScoringConfig
from apis import keys
from tests.core.pods import gpus, pod
from tests.support.machines import machine_device

SCORER = NodeScorer(ScoringConfig.from_dict({}))


def cluster(*names: str) -> ClusterState:
    out = ClusterState()
    for name in names:
        out.upsert_node({"metadata": {"name": name, "labels": {"zone": name[-1]}},
                         "status": {"allocatable": {"cpu": "100", "memory": "1000Gi", "pods": "110"}}})  # fmt: skip
        out.set_device(machine_device("dgx-h100", name))
    return out


def test_a_reservation_goes_where_a_pod_would_and_says_why_not() -> None:
    c = cluster("n-a", "n-b")
    got = place(c, pod_request(pod(gpus(4))), scorer=SCORER)
    assert isinstance(got, RoomPlan) and got.node in ("n-a", "n-b") and len(got.allocation.minors("gpu")) == 4
    selected = pod(gpus(2))
    selected["spec"]["nodeSelector"] = {"zone": "b"}
    assert place(c, pod_request(selected), scorer=SCORER).node == "n-b"  # type: ignore[union-attr]
    none = place(c, pod_request(pod(gpus(16))), scorer=SCORER)
    assert isinstance(none, NoRoom) and none.message.startswith("0/2 nodes can hold it") and none.unresolvable


def test_nodes_refused_beforehand_are_never_chosen_and_say_why() -> None:
    c = cluster("n-a", "n-b")
    why = Rejection("topoalloc: node in DRA mode", "node hands its devices out through ResourceClaims")
    got = place(c, pod_request(pod(gpus(4))), ["n-a", "n-b"], scorer=SCORER, refused={"n-a": why})
    assert isinstance(got, RoomPlan) and got.node == "n-b"
    none = place(c, pod_request(pod(gpus(4))), ["n-a"], scorer=SCORER, refused={"n-a": why})
    assert isinstance(none, NoRoom)
    assert none.message == "0/1 node can hold it: 1 node hands its devices out through ResourceClaims"


def test_single_numa_node_templates_keep_their_devices_on_one() -> None:
    c = cluster("n-a")
    spec = {keys.NUMA_TOPOLOGY_SPEC: json.dumps({"numaTopologyPolicy": "SingleNUMANode"})}
    got = place(c, pod_request(pod(gpus(4), annotations=spec)), scorer=SCORER)
    assert isinstance(got, RoomPlan) and got.numa in (0, 1)
    assert got.allocation.minors("gpu") == ([0, 1, 2, 3] if got.numa == 0 else [4, 5, 6, 7])
    whole = place(c, pod_request(pod(gpus(8), annotations=spec)), scorer=SCORER)
    assert isinstance(whole, NoRoom) and "single NUMA node" in whole.message


def test_rooms_cpu_is_kept_from_other_pods_without_a_loop_over_nodes() -> None:
    c = cluster("n-a", "n-b")
    c.assign(room_key("r"), "n-a", None, cpu_milli=90_000)
    hungry = pod_request(pod({"cpu": "20"}))
    assert set(short_of_rooms(c, hungry, ["n-a", "n-b", "ghost"])) == {"n-a"}
    assert short_of_rooms(c, pod_request(pod({"cpu": "5"})), ["n-a", "n-b"]) == {}
    c.assign("default/pod", "n-b", None, cpu_milli=95_000)  # no room there: kube-scheduler's to judge
    assert set(short_of_rooms(c, hungry, ["n-a", "n-b"])) == {"n-a"}
