"""Scenario: a pod kube-scheduler holds back gets a Reservation's room the moment it is given back.

One DGX H100 node: filler pods take 4 + 2 GPUs, a Reservation for nobody the other 2. A 2-GPU pod
created then is refused by the extender (the room is held) and kube-scheduler parks it in its
unschedulable queue, where it would wait up to five minutes: nothing kube-scheduler watches changes
when a Reservation expires or is deleted. The allocator offers the freed room to it (an annotation
write moves it out of that queue), and it is bound within 15 s of the Reservation turning Failed
(expired) or being deleted, on the freed GPUs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from apis import keys
from tests.cluster.harness import ClusterEnv, gpu_minors, gpu_pod, ready_nodes
from tests.support.controlplane import ApiStatus, wait_until

POOL = {"topoalloc.test/pool": "freed-room"}
NODE = "fr-a"
RESERVATIONS = "/apis/scheduling.koordinator.sh/v1alpha1/reservations"
FREED_WITHIN = 15.0


@pytest.fixture(scope="module", autouse=True)
def nodes(cluster: ClusterEnv) -> Iterator[None]:
    with ready_nodes(cluster, {NODE: POOL}):
        yield


@pytest.fixture
def room(cluster: ClusterEnv, ns: str) -> Iterator[str]:
    """The Reservation's name (cluster-scoped: deleted after the test)."""
    name = f"room-{ns}"
    yield name
    with contextlib.suppress(ApiStatus):
        cluster.cp.admin.delete(f"{RESERVATIONS}/{name}")


def reservation(name: str, gpus: int, ttl: str) -> dict[str, Any]:
    requests = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "metadata": {"namespace": "default"},
                "spec": {
                    "nodeName": NODE,
                    "containers": [{"name": "main", "resources": {"requests": requests, "limits": requests}}],
                },
            },
            "owners": [{"labelSelector": {"matchLabels": {"app": f"nobody-{name}"}}}],
            "ttl": ttl,
        },
    }


def phase(cluster: ClusterEnv, name: str) -> str:
    return str((cluster.cp.admin.get(f"{RESERVATIONS}/{name}").get("status") or {}).get("phase") or "")


def unschedulable(cluster: ClusterEnv, ns: str, name: str) -> bool:
    """kube-scheduler tried the pod and holds it back (PodScheduled False, reason Unschedulable)."""
    pod = cluster.pod(ns, name)
    assert not pod["spec"].get("nodeName"), f"{name} was bound while the room was held"
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


@pytest.mark.parametrize("how", ["expired", "deleted"])
def test_a_held_back_pod_is_bound_as_soon_as_the_reservations_room_is_given_back(
    cluster: ClusterEnv, ns: str, room: str, how: str
) -> None:
    taken: set[int] = set()
    for name, gpus in (("four", 4), ("two", 2)):  # the node's partitions: 1, 2, 4 or 8 GPUs
        cluster.create_pod(ns, gpu_pod(name, gpus=gpus, node_selector=POOL))
        taken |= set(gpu_minors(cluster.wait_bound(ns, name)))
    # Long enough for the waiter to be tried and parked first, even on a loaded machine.
    cluster.cp.admin.post(RESERVATIONS, reservation(room, 2, "25s" if how == "expired" else "1h"))
    wait_until(lambda: phase(cluster, room) == "Available", timeout=60, what=f"Reservation {room} Available")
    cluster.create_pod(ns, gpu_pod("waiter", gpus=2, node_selector=POOL))
    wait_until(lambda: unschedulable(cluster, ns, "waiter"), timeout=20, what="the waiter held back")
    assert phase(cluster, room) == "Available", "the room expired before the waiter was tried"
    if how == "deleted":
        cluster.cp.admin.delete(f"{RESERVATIONS}/{room}")
    else:
        wait_until(lambda: phase(cluster, room) == "Failed", timeout=60, what=f"Reservation {room} Failed")
    bound = cluster.wait_bound(ns, "waiter", timeout=FREED_WITHIN)
    assert bound["spec"]["nodeName"] == NODE
    assert taken.isdisjoint(gpu_minors(bound)) and len(gpu_minors(bound)) == 2
    assert bound["metadata"]["annotations"][keys.NUDGED].startswith(f"room freed on {NODE} at ")
