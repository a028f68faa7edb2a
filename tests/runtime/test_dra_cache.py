"""The watch cache's DRA part fed event by event into the real core: allocated claims count as used
whoever allocated them, claim holds hand over to the claim's own entry, slices make a node's pool,
and the extender path refuses DRA-mode nodes."""

from __future__ import annotations

from typing import Any

from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.request.usage import claim_usage_key
from allocator.core.reservation.room import Room
from allocator.runtime.cache.store import ClusterCache
from allocator.runtime.coreadapter import DRA_MODE, CoreAdapter
from allocator.runtime.kube import DEVICES, NODES, PODS, RESOURCECLAIMS, RESOURCESLICES
from apis import dra
from apis.annotations import DeviceAllocation, DeviceAllocations
from apis.dra_claims import DeviceResult, allocation_status
from apis.quantity import Quantity
from tests.runtime.test_store import stamped
from tests.support.allocator_harness import device, node, pod

GPU = "gpu"


def cache_with(*names: str, mode: str = dra.MODE_DRA) -> ClusterCache:
    cache = ClusterCache(CoreAdapter())
    for name in names:
        cache.apply(NODES, "ADDED", stamped(node(name, labels={dra.MODE_LABEL: mode})))
        cache.apply(DEVICES, "ADDED", stamped(device(name)))
    return cache


def claim(
    name: str, devices: list[str] | None = None, *, node_name: str = "n1", driver: str = dra.DRIVER
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "r",
                        "exactly": {"deviceClassName": dra.GPU_CLASS, "count": max(1, len(devices or []))},
                    }
                ]
            }
        },
    }
    if devices is not None:
        results = [DeviceResult("r", driver, node_name, d) for d in devices]
        obj["status"] = {"allocation": allocation_status(results, node_name)}
    return stamped(obj)


def free_gpus(cache: ClusterCache, name: str) -> int:
    state = cache.core.cluster.nodes[name]
    return GPUSummary.of(state).whole_mask.bit_count()


def test_an_allocated_claim_counts_as_used_until_it_goes() -> None:
    cache = cache_with("n1")
    assert free_gpus(cache, "n1") == 8
    c = claim("c", [f"gpu-{m}" for m in range(7)])
    cache.apply(RESOURCECLAIMS, "ADDED", c)  # e.g. kube-scheduler's own allocation of an opted-out claim
    assert free_gpus(cache, "n1") == 1
    state = cache.core.cluster.nodes["n1"]
    assert state.pod_count == 0  # a claim takes devices, not a pod slot
    cache.apply(RESOURCECLAIMS, "DELETED", c)
    assert free_gpus(cache, "n1") == 8


def test_other_drivers_and_pools_take_nothing_here() -> None:
    cache = cache_with("n1")
    cache.apply(RESOURCECLAIMS, "ADDED", claim("a", ["gpu-0"], driver="gpu.nvidia.com"))
    cache.apply(RESOURCECLAIMS, "ADDED", claim("b", ["gpu-1"], node_name="elsewhere"))
    assert free_gpus(cache, "n1") == 8


def test_a_vf_result_takes_that_vf() -> None:
    cache = cache_with("n1")
    cache.apply(RESOURCECLAIMS, "ADDED", claim("v", ["rdma-0-vf-1"]))
    state = cache.core.cluster.nodes["n1"]
    inv = state.inventory
    assert inv is not None
    nic = inv.slot("rdma", 0)
    assert nic is not None and state.vf_taken["rdma"][0] == {nic.vfs[1].bus_id}


def test_a_claim_seen_before_its_device_counts_once_the_device_arrives() -> None:
    cache = ClusterCache(CoreAdapter())
    cache.apply(NODES, "ADDED", stamped(node("n1", labels={dra.MODE_LABEL: dra.MODE_DRA})))
    cache.apply(RESOURCECLAIMS, "ADDED", claim("c", ["gpu-0", "gpu-1"]))
    cache.apply(DEVICES, "ADDED", stamped(device("n1")))
    assert free_gpus(cache, "n1") == 6


def test_a_claim_hold_hands_over_to_the_written_claim() -> None:
    cache = cache_with("n1")
    c = claim("c")
    cache.apply(RESOURCECLAIMS, "ADDED", c)
    whole = {n: Quantity.of(100) for n in ("koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio")}
    allocs = DeviceAllocations({GPU: [DeviceAllocation(3, whole)]})
    key = claim_usage_key("ns/c")
    req = cache.core.request(pod("p"))
    held = cache.ledger.hold_claim(key, "u-c", "n1", allocs, req, "claims")
    assert not isinstance(held, str) and free_gpus(cache, "n1") == 7
    assert cache.core.cluster.nodes["n1"].requested_cpu_milli == req.cpu_milli  # the caller strips these
    written = claim("c", ["gpu-3"])
    cache.apply(RESOURCECLAIMS, "MODIFIED", written)
    assert key not in cache.ledger.holds and free_gpus(cache, "n1") == 7
    assert not GPUSummary.of(cache.core.cluster.nodes["n1"]).whole_mask >> 3 & 1


def test_a_failed_write_gives_the_hold_back() -> None:
    cache = cache_with("n1")
    key = claim_usage_key("ns/c")
    allocs = DeviceAllocations({GPU: [DeviceAllocation(0, {"koordinator.sh/gpu-core": Quantity.of(100)})]})
    cache.ledger.hold_claim(
        key, "u", "n1", allocs, cache.core.request(pod("p", requests={"cpu": "0"})), "claims"
    )
    assert (
        cache.ledger.hold_claim(key, "u", "n1", allocs, cache.core.request(pod("p")), "claims")
        == "the claim or its node is busy"
    )
    assert cache.ledger.drop_hold(key, force=True) and free_gpus(cache, "n1") == 8


def slice_obj(
    name: str, pool: str, generation: int, count: int, devices: list[str], driver: str = dra.DRIVER
) -> dict[str, Any]:
    return stamped(
        {
            "metadata": {"name": name},
            "spec": {
                "driver": driver,
                "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
                "nodeName": pool,
                "devices": [{"name": d, "attributes": {"type": {"string": "gpu"}}} for d in devices],
            },
        }
    )


def test_a_pool_is_published_once_complete_and_at_its_newest_generation() -> None:
    cache = cache_with("n1")
    cache.apply(RESOURCESLICES, "ADDED", slice_obj("s0", "n1", 1, 2, ["gpu-0"]))
    assert "n1" not in cache.dra.published  # one of two slices
    cache.apply(RESOURCESLICES, "ADDED", slice_obj("s1", "n1", 1, 2, ["gpu-1"]))
    assert sorted(cache.dra.published["n1"].devices) == ["gpu-0", "gpu-1"]
    cache.apply(RESOURCESLICES, "MODIFIED", slice_obj("s0", "n1", 2, 1, ["gpu-0"]))  # gpu-1 gone
    assert sorted(cache.dra.published["n1"].devices) == ["gpu-0"]
    cache.apply(RESOURCESLICES, "ADDED", slice_obj("x", "n1", 9, 1, ["gpu-7"], driver="gpu.nvidia.com"))
    assert sorted(cache.dra.published["n1"].devices) == ["gpu-0"]
    cache.apply(RESOURCESLICES, "DELETED", slice_obj("s0", "n1", 2, 1, []))
    assert "n1" not in cache.dra.published


def test_dra_mode_nodes_refuse_device_pods_only() -> None:
    cache = cache_with("dra-1")
    for name in ("dp-1",):
        cache.apply(NODES, "ADDED", stamped(node(name, labels={dra.MODE_LABEL: dra.MODE_DEVICE_PLUGIN})))
        cache.apply(DEVICES, "ADDED", stamped(device(name)))
    core = cache.core
    gpu_pod = core.request(pod("g", gpus=1))
    passed, failed = core.filter_each(gpu_pod, ["dra-1", "dp-1"])
    assert passed == ["dp-1"] and failed["dra-1"] is DRA_MODE
    verdicts = core.filter_nodes(gpu_pod, ["dra-1", "dp-1"])
    assert verdicts.passed == ["dp-1"] and verdicts.unresolvable == {"dra-1": DRA_MODE.message}
    assert core.allocate(gpu_pod, "dra-1") is DRA_MODE
    # Nor do Reservations' rooms there (a cpu-only room may sit on it) lend device resources.
    none = DeviceAllocations({})
    room = Room("r", "dra-1", none, none, cpu_milli=1000, reserved_cpu_milli=1000)
    assert core.room_allocate(gpu_pod, room) is DRA_MODE
    assert core.ignoring_allocate(gpu_pod, "dra-1", [room.key]) is DRA_MODE
    assert core.room_allocate(core.request(pod("c2")), room) == none
    cpu_pod = core.request(pod("c"))
    assert core.filter_each(cpu_pod, ["dra-1", "dp-1"])[0] == ["dra-1", "dp-1"]
    # The label going away puts the node back on the extender path.
    cache.apply(NODES, "MODIFIED", stamped(node("dra-1")))
    assert core.filter_each(gpu_pod, ["dra-1"])[0] == ["dra-1"]


def test_a_bound_claim_pod_counts_its_cpu_and_its_claim_the_devices() -> None:
    cache = cache_with("n1")
    cache.apply(RESOURCECLAIMS, "ADDED", claim("c", ["gpu-0"]))
    cache.apply(PODS, "ADDED", stamped(pod("p", node_name="n1")))
    state = cache.core.cluster.nodes["n1"]
    assert state.pod_count == 1 and state.requested_cpu_milli == 1000 and free_gpus(cache, "n1") == 7
