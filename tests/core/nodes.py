"""Node states for the core tests, built from the protocol's example CR or the machine CRs."""

from __future__ import annotations

from typing import Any

from allocator.core.cluster.state import ClusterState
from allocator.core.node.inventory import build_inventory
from allocator.core.node.state import NodeState
from apis import keys
from apis.annotations import DeviceAllocations
from tests.support.allocations import entry
from tests.support.machines import koordinator_example_device

CORE, MEM, RATIO, RDMA = (
    "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory",
    "koordinator.sh/gpu-memory-ratio",
    "koordinator.sh/rdma",
)
H800_MEMORY = 81559 * 2**20


def plain_example_device() -> dict[str, Any]:
    """The section 2.4 node without its partition table and Honor policy: the scope walk decides."""
    dev = koordinator_example_device()
    dev["metadata"]["annotations"] = {}
    del dev["metadata"]["labels"][keys.GPU_PARTITION_POLICY]
    return dev


def state_of(device: dict[str, Any], node_labels: dict[str, str] | None = None, name: str = "n") -> NodeState:
    labels = {} if node_labels is None else node_labels
    return NodeState(name, build_inventory(device, labels), labels)


def use_gpus(state: NodeState, *minors: int, share: int = 100, key: str | None = None) -> None:
    """A pod holding `share` percent of each listed GPU (memory filled as Koordinator does)."""
    entries = [entry(m, {CORE: share, RATIO: share, MEM: H800_MEMORY * share // 100}) for m in minors]
    state.add_pod(key or f"ns/use-{'-'.join(map(str, minors))}-{share}", DeviceAllocations({"gpu": entries}))


def use_vf(state: NodeState, nic: int, bus: str, key: str | None = None) -> None:
    state.add_pod(key or f"ns/vf-{bus}", DeviceAllocations({"rdma": [entry(nic, {RDMA: 1}, bus)]}))


def cluster_of(*devices: dict[str, Any], cpu: str = "64", memory: str = "512Gi") -> ClusterState:
    """A cluster of one Node per Device object (named as the Device), each with `cpu` and `memory`
    allocatable and 110 pods."""
    cluster = ClusterState()
    for doc in devices:
        alloc = {"cpu": cpu, "memory": memory, "pods": "110"}
        cluster.upsert_node({"metadata": {"name": doc["metadata"]["name"]}, "status": {"allocatable": alloc}})
        cluster.set_device(doc)
    return cluster
