"""Rooms on a node whose kubelet runs a Topology Manager policy: kubelet never hears of a
Reservation, so its NUMA hints count a room's devices as free (node/kubelet_view.py). The devices
the core chooses must lie where kubelet, so counting, aligns the pod (the stand-in kubelet's merge,
tests/support/topology_manager.py, is the oracle), or the pod is not placed there."""

from __future__ import annotations

from allocator.core.cluster.state import ClusterState
from allocator.core.devices.allocate import Allocation, allocate
from allocator.core.devices.numa_policy import TOPOLOGY_MANAGER
from allocator.core.reasons import Rejection
from allocator.core.request.parse import pod_request
from allocator.core.reservation.consume import allocate_from_room
from allocator.core.reservation.place import RoomPlan, place
from allocator.core.reservation.room import Room, room_key
from allocator.core.scoring.scorer import NodeScorer, ScoringConfig
from apis.kubelet_policy import NUMA_TOPOLOGY_POLICY
from tests.core.pods import gpus, pod
from tests.support import topology_manager as kubelet
from tests.support.machines import machine_device

SCORER = NodeScorer(ScoringConfig.from_dict({}))
NODE = "n-a"


def _cluster() -> ClusterState:
    c = ClusterState()
    c.upsert_node({"metadata": {"name": NODE, "labels": {NUMA_TOPOLOGY_POLICY: "SingleNUMANode"}},
                   "status": {"allocatable": {"cpu": "100", "memory": "1000Gi", "pods": "110"}}})  # fmt: skip
    c.set_device(machine_device("dgx-h100", NODE))
    return c


def _kubelets_numa(c: ClusterState, want: int) -> int | None:
    """The NUMA node kubelet aligns a `want`-GPU pod on: the GPUs of pods are all it counts used."""
    inv = c.nodes[NODE].inventory
    assert inv is not None
    numa_of = {str(s.minor): s.numa for s in inv.slots("gpu")}
    held = {m for key, e in c.nodes[NODE].pods.items() if "/" in key for _, m, _ in e.used}
    free = [d for d in numa_of if int(d) not in held]
    hints = kubelet.device_hints([0, 1], numa_of, free, want)
    best, admitted = kubelet.merge("single-numa-node", [0, 1], [{"nvidia.com/gpu": hints}])
    return best.mask.bit_length() - 1 if admitted and best.mask else None


def _numa(c: ClusterState, got: Allocation) -> set[int]:
    inv = c.nodes[NODE].inventory
    assert inv is not None
    return {s.numa for s in inv.slots("gpu") if s.minor in got.devices.minors("gpu")}


def test_a_room_is_free_to_kubelet_so_other_pods_go_only_where_kubelet_aligns_them() -> None:
    c = _cluster()
    template = pod_request(pod(gpus(4)))
    plan = place(c, template, scorer=SCORER)
    assert isinstance(plan, RoomPlan) and _numa(c, plan.allocation) == {0}
    c.assign(
        room_key("r"), NODE, plan.allocation.devices, template.cpu_milli, template.memory, request=template
    )
    # kubelet sees all eight GPUs free and aligns any GPU pod on NUMA node 0, where the room holds
    # every GPU: another pod is not placed (GPUs on NUMA node 1 would be refused at admission)
    assert _kubelets_numa(c, 4) == 0 and _kubelets_numa(c, 2) == 0
    for n in (4, 2):
        got = allocate(c.nodes[NODE], pod_request(pod(gpus(n), name="other")))
        assert isinstance(got, Rejection) and got.code == TOPOLOGY_MANAGER, got
    # the owner takes the room's GPUs, which is where kubelet aligns it
    room = Room("r", NODE, plan.allocation.devices, plan.allocation.devices)
    owner = allocate_from_room(c.nodes[NODE], pod_request(pod(gpus(4), name="owner")), room)
    assert isinstance(owner, Allocation) and owner.devices.minors("gpu") == [0, 1, 2, 3]
    # once the owner is a pod there (the used-up room counts nothing), kubelet counts its GPUs
    c.unassign(room_key("r"))
    c.assign("default/owner", NODE, owner.devices, request=pod_request(pod(gpus(4), name="owner")))
    assert _kubelets_numa(c, 4) == 1
    other = allocate(c.nodes[NODE], pod_request(pod(gpus(4), name="other")))
    assert isinstance(other, Allocation) and _numa(c, other) == {1}
