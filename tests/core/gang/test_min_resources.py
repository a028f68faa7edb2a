"""PodGroup minResources as a necessary check (allocator/core/gang/min_resources.py) on hand-built
DGX H100 nodes (8 GPUs each) whose allocatable and running pods are set by each test."""

from __future__ import annotations

from allocator.core.cluster.state import ClusterState
from allocator.core.gang.min_resources import AVAILABLE, CAPACITY, min_resources_shortage, wanted_amounts
from apis.annotations import DeviceAllocations
from apis.quantity import Quantity
from tests.support.allocations import entry
from tests.support.machines import dgx_h100_device

WHOLE = {"koordinator.sh/gpu-core": 100, "koordinator.sh/gpu-memory-ratio": 100}


def cluster(nodes: int, *, busy: int = 0) -> ClusterState:
    """`nodes` DGX nodes (64 cpu, 1 Ti memory); on each, `busy` GPUs held by 1-GPU pods
    `p/<node>-<minor>` that also request 4 cpu."""
    c = ClusterState()
    for i in range(nodes):
        name = f"n{i}"
        alloc = {"cpu": "64", "memory": "1Ti", "nvidia.com/gpu": "8", "pods": "110"}
        c.upsert_node({"metadata": {"name": name}, "status": {"allocatable": alloc}})
        c.set_device(dgx_h100_device(name))
        for m in range(busy):
            c.assign(f"p/{name}-{m}", name, DeviceAllocations({"gpu": [entry(m, WHOLE)]}), cpu_milli=4000)
    return c


def q(spec: dict[str, str]) -> dict[str, Quantity]:
    return {k: Quantity.parse(v) for k, v in spec.items()}


NAMES = ["n0", "n1", "n2", "n3"]


def test_unmeasured_and_zero_resources_are_ignored() -> None:
    assert wanted_amounts(q({"example.com/foo": "5", "cpu": "0", "memory": "2Gi"})) == {"memory": 2 << 30}
    assert min_resources_shortage(cluster(1), q({"example.com/foo": "999"}), ["n0"]) is None
    assert min_resources_shortage(cluster(1), {}, ["n0"]) is None


def test_more_gpus_than_the_cluster_has_is_a_capacity_shortage() -> None:
    c = cluster(4)
    assert min_resources_shortage(c, q({"nvidia.com/gpu": "32"}), NAMES) is None
    got = min_resources_shortage(c, q({"nvidia.com/gpu": "33"}), NAMES)
    assert got is not None and (got.resource, got.wanted, got.have, got.scope) == (
        "nvidia.com/gpu",
        33,
        32,
        CAPACITY,
    )
    assert "minResources nvidia.com/gpu=33" in got.message and "(32)" in got.message
    # Only the nodes the gang may use count (taints, selectors: the controller's names).
    got = min_resources_shortage(c, q({"nvidia.com/gpu": "24"}), ["n0", "n1"])
    assert got is not None and got.have == 16


def test_cpu_is_counted_in_millicores_and_shown_in_cores() -> None:
    c = cluster(2)
    assert min_resources_shortage(c, q({"cpu": "128"}), ["n0", "n1"]) is None
    got = min_resources_shortage(c, q({"cpu": "128500m"}), ["n0", "n1"])
    assert (
        got is not None and got.scope == CAPACITY and "cpu=128500m" in got.message and "(128)" in got.message
    )


def test_busy_gpus_count_only_when_preemption_may_free_them() -> None:
    c = cluster(4, busy=6)  # 8 of 32 GPUs free
    assert min_resources_shortage(c, q({"nvidia.com/gpu": "8"}), NAMES) is None
    got = min_resources_shortage(c, q({"nvidia.com/gpu": "16"}), NAMES)
    assert got is not None and (got.have, got.scope) == (8, AVAILABLE)
    # Every pod on n0 and n1 may be evicted: 8 + 12 GPUs can be had.
    removable = {f"p/n{i}-{m}" for i in (0, 1) for m in range(6)}
    assert min_resources_shortage(c, q({"nvidia.com/gpu": "20"}), NAMES, removable) is None
    got = min_resources_shortage(c, q({"nvidia.com/gpu": "21"}), NAMES, removable)
    assert got is not None and got.have == 20


def test_cpu_held_by_staying_pods_is_not_available() -> None:
    c = cluster(1, busy=8)  # 8 pods x 4 cpu of 64
    assert min_resources_shortage(c, q({"cpu": "32"}), ["n0"]) is None
    got = min_resources_shortage(c, q({"cpu": "33"}), ["n0"])
    assert got is not None and (got.resource, got.have, got.scope) == ("cpu", 32000, AVAILABLE)
    assert min_resources_shortage(c, q({"cpu": "36"}), ["n0"], {"p/n0-0"}) is None


def test_a_node_without_its_device_counts_its_gpus_once_from_its_allocatable() -> None:
    """No Device CR yet: the node's GPUs are its allocatable's, whichever name announces them
    (the agent's `koordinator.sh/gpu` in hundreds), and the device plugin's `nvidia.com/gpu` for
    the same cards does not double them."""
    c = ClusterState()
    both = {"cpu": "64", "nvidia.com/gpu": "8", "koordinator.sh/gpu": "800"}
    c.upsert_node({"metadata": {"name": "both"}, "status": {"allocatable": both}})
    c.upsert_node({"metadata": {"name": "agent"}, "status": {"allocatable": {"koordinator.sh/gpu": "800"}}})
    assert min_resources_shortage(c, q({"nvidia.com/gpu": "16"}), ["both", "agent"]) is None
    got = min_resources_shortage(c, q({"nvidia.com/gpu": "9"}), ["both"])
    assert got is not None and (got.have, got.scope) == (8, CAPACITY)
