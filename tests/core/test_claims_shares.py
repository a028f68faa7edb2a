"""GPU shares on DRA (consumable capacity): a claim asking `cores`/`memory` of a GPU published with
allowMultipleAllocations is the core's share request, placed with the device-plugin path's share
logic; its result carries what it consumes, computed as kube-scheduler does; what claims consume
together never exceeds a GPU. Pools come from the node side's slice builder on a recorded DGX
H100, its GPUs made sharable the way the agent publishes them on 1.36 (apis/dra.py gpu_capacity)."""

from __future__ import annotations

from typing import Any

import pytest

from agent.dra.slices import pool_devices, pool_slices, whole
from allocator.core.claims.published import NodeDevices, results_usage
from allocator.core.claims.published import pool_devices as node_pool
from allocator.core.claims.solve import WHOLE_ONLY, ClaimAnswer, solve
from allocator.core.devices.allocate import allocate
from allocator.core.reasons import Rejection
from allocator.core.request.claims import REFUSE, ClaimsRequest, classify, translate
from allocator.core.request.parse import pod_request
from apis import dra
from apis.device import Device
from apis.dra_capacity import DeviceCapacity, consumed, fits
from apis.dra_claims import allocation_status, claim_spec
from apis.dra_slices import ResourceSlice
from apis.quantity import Quantity
from tests.core.allocating import MOST
from tests.core.pods import pod
from tests.core.test_claims_solve import CLASSES, Node, creq, gpus

GIB = 1024**3


def share(cores: str | None = None, memory: str | None = None, count: int = 1) -> Any:
    requests = {k: v for k, v in ((dra.CAPACITY_CORES, cores), (dra.CAPACITY_MEMORY, memory)) if v}
    exactly = {"deviceClassName": dra.GPU_CLASS, "count": count, "capacity": {"requests": requests}}
    return claim_spec({"requests": [{"name": "gpu", "exactly": exactly}]}, "")


def sharable(node: Node, *, only: tuple[str, ...] = ()) -> NodeDevices:
    """The node's pool with its GPUs published sharable (and only the GPUs `only` names, if any)."""
    devices = []
    for dev in node.pool.devices.values():
        name = dra.parse_device_name(dev.name)
        if name is None or name.type != dra.TYPE_GPU:
            continue
        if only and dev.name not in only:
            continue
        memory = str(Quantity.milli(dev.capacity[dra.qualified(dra.CAPACITY_MEMORY)]))
        devices.append(
            {
                "name": dev.name,
                "allowMultipleAllocations": True,
                "attributes": {
                    k.removeprefix(f"{dra.DRIVER}/"): {"int" if isinstance(v, int) else "string": v}
                    for k, v in dev.attributes.items()
                    if not isinstance(v, bool)
                },
                "capacity": dra.gpu_capacity(memory, sharable=True),
            }
        )
    obj = {
        "metadata": {"name": f"{node.name}-slice"},
        "spec": {
            "driver": dra.DRIVER,
            "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node.name,
            "devices": devices,
        },
    }
    found = node_pool(node.name, [ResourceSlice.from_dict(obj)])
    assert found is not None
    return found


def shared_node(**kwargs: Any) -> Node:
    node = Node("dgx-h100")
    node.pool = sharable(node, **kwargs)
    return node


def results(answer: ClaimAnswer | Rejection, claim: str = "ns/c0") -> list[dict[str, Any]]:
    assert isinstance(answer, ClaimAnswer), answer
    return allocation_status(answer.results[claim], answer.node, 0)["devices"]["results"]


# -- the request ----------------------------------------------------------------------------------


def test_a_share_claim_is_the_core_share_request() -> None:
    assert classify(share("50", "40Gi"), opted_out=False).kind == "ours"
    got = creq(share("30", "10Gi"))
    g = got.pod.gpu
    assert g is not None and g.count == 1 and g.shared
    assert dict(g.per_gpu_map) == {"koordinator.sh/gpu-core": 30, "koordinator.sh/gpu-memory": 10 * GIB}
    # memory only: the whole compute (the GPU's default), so it cannot share compute
    only_memory = creq(share(memory="10Gi")).pod.gpu
    assert only_memory is not None and dict(only_memory.per_gpu_map)["koordinator.sh/gpu-core"] == 100


def test_a_share_is_a_pods_only_gpu() -> None:
    verdict = classify(share("50", count=2), opted_out=False)
    assert verdict.kind == REFUSE and "count 1, not 2" in verdict.reason
    got = translate(pod_request(pod({"cpu": "1"})), [("ns/a", share("50")), ("ns/b", gpus(1))], CLASSES)
    assert isinstance(got, Rejection) and "a pod's GPU share is its only GPU" in got.message


# -- kube-scheduler's rounding ----------------------------------------------------------------------


def cap(value: str, default: str | None = None, **policy: str) -> DeviceCapacity:
    q = Quantity.parse
    return DeviceCapacity(
        q(value),
        None if default is None else q(default),
        *(None if policy.get(k) is None else q(policy[k]) for k in ("min", "max", "step")),
        tuple(q(v) for v in policy.get("values", "").split()),
    )


def test_consumed_rounds_as_kube_scheduler_does() -> None:
    caps = {
        "cores": cap("100", "100", min="1", max="100", step="1"),
        "memory": cap("80Gi", "80Gi", min="1Mi"),
    }
    got = consumed({"cores": Quantity.parse("33.5"), "memory": Quantity.parse("100Ki")}, caps)
    assert got == {"cores": Quantity.parse("34"), "memory": Quantity.parse("1Mi")}
    assert {k: str(v) for k, v in (consumed({}, caps) or {}).items()} == {"cores": "100", "memory": "80Gi"}
    assert consumed({"cores": Quantity.parse("101")}, caps) is None  # beyond max
    assert consumed({"power": Quantity.parse("1")}, caps) is None  # the device has no such capacity
    stepped = {"m": cap("8", "2", min="2", step="2")}
    assert consumed({"m": Quantity.parse("3")}, stepped) == {"m": Quantity.parse("4")}
    listed = {"m": cap("8", "2", values="2 4 8")}
    assert consumed({"m": Quantity.parse("3")}, listed) == {"m": Quantity.parse("4")}
    assert consumed({"m": Quantity.parse("9")}, listed) is None  # beyond every valid value
    assert fits({"cores": Quantity.parse("50")}, {"cores": Quantity.parse("50")}, caps)
    assert not fits({"cores": Quantity.parse("51")}, {"cores": Quantity.parse("50")}, caps)


# -- placement ---------------------------------------------------------------------------------------


def test_two_shares_fit_on_one_gpu_and_a_third_that_would_exceed_is_refused() -> None:
    node = shared_node(only=("gpu-0",))
    first = solve_take(node, share("50", "30Gi"))
    second = solve_take(node, share("50", "30Gi"))
    assert [r["device"] for r in first + second] == ["gpu-0", "gpu-0"]
    third = node.solve(share("10", "1Gi"))
    assert isinstance(third, Rejection) and "GPU" in third.message, third
    # what is left is memory, not compute: a share asking no cores takes all of it and waits too
    assert isinstance(node.solve(share(memory="1Gi")), Rejection)


def solve_take(node: Node, claim: Any) -> list[dict[str, Any]]:
    answer = node.solve(claim)
    out = results(answer)
    node.take(answer)
    return out


def test_results_carry_a_share_id_and_what_they_consume() -> None:
    node = shared_node()
    (result,) = results(node.solve(share("25.5", "10Gi")))
    assert result["consumedCapacity"] == {"cores": "26", "memory": "10Gi"}
    assert len(result["shareID"]) == 36 and result["driver"] == dra.DRIVER
    (other,) = results(node.solve(share("25.5", "10Gi")))
    assert other["shareID"] != result["shareID"]  # fresh for each allocation
    # a whole GPU on a sharable device consumes the defaults: all of it
    (whole,) = results(node.solve(gpus(1)))
    memory = node.pool.devices[whole["device"]].capacities[dra.CAPACITY_MEMORY].value
    assert whole["consumedCapacity"] == {"cores": "100", "memory": str(memory)} and whole["shareID"]


def test_whole_and_share_exclude_each_other() -> None:
    node = shared_node(only=("gpu-0",))
    solve_take(node, gpus(1))
    refused = node.solve(share("10", "1Gi"))
    assert isinstance(refused, Rejection), refused
    node = shared_node(only=("gpu-0",))
    solve_take(node, share("10", "1Gi"))
    assert isinstance(node.solve(gpus(1)), Rejection)


def test_shares_are_placed_as_the_device_plugin_path_places_them() -> None:
    """Bin-packing and fragmentation: the same GPU the core picks for a pod asking the same share
    with koordinator.sh/gpu-core and gpu-memory, with a GPU already part used."""
    node = shared_node()
    first = solve_with(node, share("40", "20Gi"))
    (used,) = results(first)
    node.take(first)  # one GPU part used
    plain = pod_request(pod({"koordinator.sh/gpu-core": "30", "koordinator.sh/gpu-memory": "10Gi"}))
    expected = allocate(node.state, plain, scoring=MOST)
    assert not isinstance(expected, Rejection)
    answer = solve_with(node, share("30", "10Gi"))
    assert [r["device"] for r in results(answer)] == [f"gpu-{e.minor}" for e in expected.devices["gpu"]]
    assert results(answer)[0]["device"] == used["device"]  # MostAllocated packs it onto that GPU


def solve_with(node: Node, claim: Any) -> ClaimAnswer | Rejection:
    return solve(node.state, creq(claim), node.pool, scoring=MOST)


def test_a_node_whose_gpus_are_whole_only_refuses_a_share_saying_so() -> None:
    node = Node("dgx-h100")
    name = node.name
    devices = whole(pool_devices(Device.from_dict(node.device), max_vfs=8))  # as the agent on 1.35
    node.pool = node_pool(name, [ResourceSlice.from_dict(s) for s in pool_slices(name, devices, 1)])
    refused = node.solve(share("50", "10Gi"))
    assert isinstance(refused, Rejection) and refused.code == WHOLE_ONLY
    assert "whole only" in refused.message and "allowMultipleAllocations" in refused.message


def test_shares_of_any_allocator_read_back_as_their_consumption() -> None:
    node = shared_node()
    answer = node.solve(share("50", "40Gi"))
    assert isinstance(answer, ClaimAnswer)
    written = [
        type(r)(r.request, r.driver, r.pool, r.device, share_id="s-1", consumed=r.consumed)
        for r in answer.results["ns/c0"]
    ]
    usage, missing = results_usage(node.state.inventory, "n1", written)
    assert missing == [] and usage.to_json() == answer.usage["ns/c0"].to_json()
    (entry,) = usage["gpu"]
    res = {k: v.value() for k, v in (entry.resources or {}).items()}
    assert res["koordinator.sh/gpu-core"] == 50 and res["koordinator.sh/gpu-memory"] == 40 * GIB
    # without a shareID (kube-scheduler's form for a whole device) it is the whole GPU
    bare = [type(r)(r.request, r.driver, r.pool, r.device, consumed=r.consumed) for r in written]
    (whole,) = results_usage(node.state.inventory, "n1", bare)[0]["gpu"]
    assert {k: v.value() for k, v in (whole.resources or {}).items()}["koordinator.sh/gpu-core"] == 100


@pytest.mark.parametrize("cores", ["0", "150"])
def test_a_share_out_of_range_is_refused(cores: str) -> None:
    verdict = classify(share(cores), opted_out=False)
    assert verdict.kind == REFUSE and "1 to 100" in verdict.reason


def test_translate_keeps_the_share_on_its_slot() -> None:
    got = creq(share("20"))
    assert isinstance(got, ClaimsRequest)
    assert dict(got.slots[0].capacity) == {"cores": Quantity.parse("20")}
