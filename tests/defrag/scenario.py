"""The defragmentation scenario on the fake API server: four nodes each run two 1-GPU pods of a
ReplicaSet while an 8-GPU pod of a higher priority waits (the controller's tests and `topoalloc
defrag`'s)."""

from __future__ import annotations

from typing import Any

from apis import keys
from apis.annotations import DeviceAllocations
from tests.support.allocations import entry
from tests.support.allocator_harness import pod, seed_nodes
from tests.support.fakeapi import FakeApiServer

GPU = {
    "koordinator.sh/gpu-core": 100,
    "koordinator.sh/gpu-memory": 81559 * 2**20,
    "koordinator.sh/gpu-memory-ratio": 100,
}
NODES = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-rs", "uid": "rs-uid", "controller": True}


def world(fake: FakeApiServer, *, waiting: bool = True) -> None:
    """The nodes and the ReplicaSet's pods, and (`waiting`) the 8-GPU pod that waits."""
    seed_nodes(fake, NODES)
    for i, node in enumerate(NODES):
        for g in range(2):
            p = pod(f"web-{i}-{g}", gpus=1, node_name=node)
            p["metadata"]["labels"] = {"app": "web"}
            p["metadata"]["ownerReferences"] = [dict(OWNER)]
            p["metadata"]["annotations"] = {
                keys.DEVICE_ALLOCATED: DeviceAllocations({"gpu": [entry(g, GPU)]}).to_json()
            }
            p["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}
            fake.put(p)
    if waiting:
        waiter(fake)


def waiter(fake: FakeApiServer) -> None:
    big = pod("big", gpus=8)
    big["spec"]["priority"] = 100
    fake.put(big)


def running(fake: FakeApiServer) -> list[str]:
    """The ReplicaSet's pods not evicted (an evicted pod is deleting: no kubelet finishes it)."""
    pods = fake.list_objects("pods", "default")
    return sorted(
        p["metadata"]["name"]
        for p in pods
        if p["metadata"]["name"] != "big" and not p["metadata"].get("deletionTimestamp")
    )


def moves_made(fake: FakeApiServer) -> list[dict[str, Any]]:
    return [
        r
        for r in fake.list_objects("reservations")
        if (r["metadata"].get("labels") or {}).get("topoalloc.io/defrag")
    ]
