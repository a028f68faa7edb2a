"""Claims -> the core's request (allocator/core/request/claims.py), CEL selectors
(request/cel.py) and the hand-out check (claims/assign.py): pure, no node needed."""

from __future__ import annotations

from typing import Any

import pytest

from allocator.core.claims.assign import assign, satisfied
from allocator.core.reasons import Rejection
from allocator.core.request.cel import PublishedDevice, SelectorError, program
from allocator.core.request.claims import (
    CLAIM_CLASS,
    CLAIM_MIXED,
    CLAIM_SELECTOR,
    FOREIGN,
    LEAVE,
    OURS,
    PCIE_SWITCH,
    REFUSE,
    ClaimsRequest,
    classify,
    translate,
)
from allocator.core.request.parse import pod_request
from apis import dra
from apis import resources as rn
from apis.dra_claims import DeviceClass, claim_spec
from tests.core.pods import gpus, pod

CLASSES = {
    name: DeviceClass(
        name, (f'device.driver == "topoalloc.io" && device.attributes["topoalloc.io"].type == "{kind}"',)
    )
    for name, kind in dra.CLASS_TYPE.items()
}


def spec(
    *requests: tuple[str, str, int], constraints: list[dict[str, Any]] | None = None, **extra: Any
) -> Any:
    reqs = [{"name": n, "exactly": {"deviceClassName": c, "count": k, **extra}} for n, c, k in requests]
    return claim_spec({"requests": reqs, "constraints": constraints or []}, "spec.devices")


def request(*claims: Any, the_pod: dict[str, Any] | None = None) -> ClaimsRequest:
    got = translate(
        pod_request(the_pod or pod({"cpu": "1"})), [(f"ns/c{i}", s) for i, s in enumerate(claims)], CLASSES
    )
    assert isinstance(got, ClaimsRequest), got
    return got


# -- classify ------------------------------------------------------------------------------------------


def test_claims_of_our_classes_are_ours_others_are_not() -> None:
    assert classify(spec(("g", dra.GPU_CLASS, 2)), opted_out=False).kind == OURS
    assert classify(spec(("g", "gpu.nvidia.com", 1)), opted_out=False).kind == FOREIGN
    left = classify(spec(("g", dra.GPU_CLASS, 1)), opted_out=True)
    assert left.kind == LEAVE and dra.ALLOCATOR_ANNOTATION in left.reason


@pytest.mark.parametrize(
    ("claim", "kind", "words"),
    [
        (spec(("g", dra.GPU_CLASS, 1), ("n", "gpu.nvidia.com", 1)), LEAVE, "not a topoalloc.io DeviceClass"),
        (
            claim_spec(
                {
                    "requests": [
                        {"name": "g", "exactly": {"deviceClassName": dra.GPU_CLASS, "allocationMode": "All"}}
                    ]
                },
                "",
            ),
            LEAVE,
            "allocationMode All",
        ),
        (spec(("g", dra.GPU_CLASS, 1), adminAccess=True), LEAVE, "adminAccess"),
        (
            claim_spec(
                {
                    "requests": [
                        {"name": "g", "firstAvailable": [{"name": "a", "deviceClassName": dra.GPU_CLASS}]}
                    ]
                },
                "",
            ),
            LEAVE,
            "firstAvailable",
        ),
        (
            spec(("n", dra.RDMA_CLASS, 1), capacity={"requests": {"memory": "1Gi"}}),
            REFUSE,
            "handed out whole",
        ),
        (spec(("g", dra.GPU_CLASS, 2), capacity={"requests": {"cores": "50"}}), REFUSE, "count 1, not 2"),
        (spec(("g", dra.GPU_CLASS, 1), capacity={"requests": {"cores": "150"}}), REFUSE, "1 to 100"),
        (spec(("g", dra.GPU_CLASS, 1), capacity={"requests": {"power": "1"}}), REFUSE, "not power"),
        (
            claim_spec(
                {
                    "requests": [{"name": "g", "exactly": {"deviceClassName": dra.GPU_CLASS}}],
                    "config": [{"opaque": {"driver": "topoalloc.io"}}],
                },
                "",
            ),
            REFUSE,
            "takes no parameters",
        ),
    ],
)
def test_what_topoalloc_leaves_to_kube_scheduler_and_what_it_refuses(
    claim: Any, kind: str, words: str
) -> None:
    verdict = classify(claim, opted_out=False)
    assert verdict.kind == kind and words in verdict.reason


# -- translate -----------------------------------------------------------------------------------------


def test_gpus_of_all_claims_become_one_whole_gpu_request() -> None:
    got = request(spec(("a", dra.GPU_CLASS, 2)), spec(("b", dra.GPU_CLASS, 1)))
    assert got.pod.gpu is not None and got.pod.gpu.count == 3 and got.pod.gpu.whole
    assert got.pod.device_types == (rn.DeviceType.GPU,)
    assert [(s.claim, s.request, s.count) for s in got.slots] == [("ns/c0", "a", 2), ("ns/c1", "b", 1)]
    assert got.pod.cpu_milli == 1000  # the pod's own requests stay


def test_scope_partition_and_regroup_constraints_over_all_gpus() -> None:
    over = lambda attr: request(spec(("g", dra.GPU_CLASS, 2), constraints=[{"matchAttribute": attr}]))  # noqa: E731
    pcie = over(PCIE_SWITCH).pod
    assert pcie.gpu is not None and pcie.gpu.required_scope == "PCIe"
    numa = over(dra.NUMA_NODE).pod
    assert numa.gpu is not None and numa.gpu.required_scope == "NUMANode"
    pair = over("topoalloc.io/nvlinkPartition2").pod
    assert pair.gpu is not None and pair.gpu.restricted_partition
    # A partition of another size, or an attribute the core has no scope for: value by value.
    assert over("topoalloc.io/nvlinkPartition4").regroup is not None
    domain = over("topoalloc.io/nvlinkDomain")
    assert domain.regroup is not None and domain.pod.gpu is not None and not domain.pod.gpu.required_scope


def test_gpu_nic_pairs_are_the_joint_allocation() -> None:
    pairs = [{"requests": [f"g{i}", f"n{i}"], "matchAttribute": PCIE_SWITCH} for i in range(2)]
    got = request(
        spec(
            ("g0", dra.GPU_CLASS, 1),
            ("n0", dra.RDMA_CLASS, 1),
            ("g1", dra.GPU_CLASS, 1),
            ("n1", dra.RDMA_CLASS, 1),
            constraints=pairs,
        )
    )
    assert got.pod.joint_types == (rn.DeviceType.GPU, rn.DeviceType.RDMA) and got.pod.joint_same_pcie
    assert got.pod.device_request(rn.DeviceType.RDMA) == {rn.RDMA: 200}
    assert len(got.pairs) == 2 and got.regroup is None


def test_vfs_ask_for_a_vf_each() -> None:
    got = request(
        spec(
            ("g", dra.GPU_CLASS, 1),
            ("v", dra.RDMA_VF_CLASS, 2),
            constraints=[{"matchAttribute": dra.NUMA_NODE}],
        )
    )
    hint = got.pod.hint(rn.DeviceType.RDMA)
    assert hint is not None and hint.vf_selector is not None and hint.allocate_strategy == "RequestsAsCount"
    assert got.pod.device_request(rn.DeviceType.RDMA) == {rn.RDMA: 2}
    assert got.pod.joint_types and not got.pod.joint_same_pcie  # NUMA: paired, not on one switch


@pytest.mark.parametrize(
    ("claims", "the_pod", "code", "words"),
    [
        ([spec(("g", "missing.example.com", 1))], None, CLAIM_CLASS, "does not exist"),
        (
            [spec(("n", dra.RDMA_CLASS, 1)), spec(("v", dra.RDMA_VF_CLASS, 1))],
            None,
            "topoalloc: claim refused",
            "whole RDMA NICs and for VFs",
        ),
        ([spec(("g", dra.GPU_CLASS, 1))], pod(gpus(1)), CLAIM_MIXED, "use one or the other"),
    ],
)
def test_claims_that_cannot_be_translated_say_why(
    claims: list[Any], the_pod: Any, code: str, words: str
) -> None:
    classes = {**CLASSES, "missing.example.com": None}
    classes.pop("missing.example.com")
    got = translate(
        pod_request(the_pod or pod({"cpu": "1"})), [(f"ns/c{i}", c) for i, c in enumerate(claims)], classes
    )
    assert isinstance(got, Rejection) and got.code == code and words in got.message


def test_a_selector_that_does_not_compile_is_refused() -> None:
    bad = claim_spec(
        {
            "requests": [
                {
                    "name": "g",
                    "exactly": {
                        "deviceClassName": dra.GPU_CLASS,
                        "selectors": [{"cel": {"expression": "device.(("}}],
                    },
                }
            ]
        },
        "",
    )
    got = translate(pod_request(pod({})), [("ns/c", bad)], CLASSES)
    assert isinstance(got, Rejection) and got.code == CLAIM_SELECTOR and "does not compile" in got.message


def test_a_class_with_opaque_config_is_refused() -> None:
    classes = {**CLASSES, dra.GPU_CLASS: DeviceClass(dra.GPU_CLASS, (), ("topoalloc.io",))}
    got = translate(pod_request(pod({})), [("ns/c", spec(("g", dra.GPU_CLASS, 1)))], classes)
    assert isinstance(got, Rejection) and "takes no parameters" in got.message


# -- CEL -------------------------------------------------------------------------------------------------

H100 = PublishedDevice(
    "gpu-0",
    attributes={
        "topoalloc.io/type": "gpu",
        "topoalloc.io/productName": "NVIDIA H100 80GB HBM3",
        "topoalloc.io/minor": 0,
    },
    capacity={"topoalloc.io/memory": 80 * 2**30 * 1000},
)
L40S = PublishedDevice(
    "gpu-1",
    attributes={"topoalloc.io/type": "gpu", "topoalloc.io/productName": "NVIDIA L40S"},
    capacity={"topoalloc.io/memory": 46 * 2**30 * 1000},
)


def test_selectors_read_attributes_and_quantities() -> None:
    by_name = program('device.attributes["topoalloc.io"].productName.startsWith("NVIDIA H100")')
    assert by_name.matches(H100) and not by_name.matches(L40S)
    big = program('device.capacity["topoalloc.io"].memory.compareTo(quantity("60Gi")) >= 0')
    assert big.matches(H100) and not big.matches(L40S)
    assert program('device.driver == "topoalloc.io"').matches(H100)


def test_a_selector_is_evaluated_once_per_value_it_reads() -> None:
    sel = program('device.attributes["topoalloc.io"].type == "gpu" && device.driver == "topoalloc.io"')
    for minor in range(50):
        assert sel.matches(
            PublishedDevice(
                f"gpu-{minor}", attributes={"topoalloc.io/type": "gpu", "topoalloc.io/minor": minor}
            )
        )
    assert len(sel._answers) == 1  # the minor is never read: one answer for all fifty


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ('semver("1.0.0").isGreaterThan(semver("0.1.0"))', "unsupported selector"),
        ('device.attributes["topoalloc.io"].linkLayer == "InfiniBand"', "fails on device gpu-0"),
        ('device.attributes["topoalloc.io"].minor == "0"', "fails on device gpu-0"),
        ("1 + 1", "not a boolean"),
    ],
)
def test_selectors_that_fail_say_why(expression: str, words: str) -> None:
    with pytest.raises(SelectorError, match=words):
        program(expression).matches(H100)


# -- assign ----------------------------------------------------------------------------------------------


def dev(name: str, **attrs: Any) -> PublishedDevice:
    return PublishedDevice(name, attributes={f"topoalloc.io/{k}": v for k, v in attrs.items()})


def test_pairs_are_handed_out_by_switch() -> None:
    pairs = [{"requests": [f"g{i}", f"n{i}"], "matchAttribute": PCIE_SWITCH} for i in range(2)]
    creq = request(
        spec(
            ("g0", dra.GPU_CLASS, 1),
            ("n0", dra.RDMA_CLASS, 1),
            ("g1", dra.GPU_CLASS, 1),
            ("n1", dra.RDMA_CLASS, 1),
            constraints=pairs,
        )
    )
    devices = {
        d.name: d
        for d in (
            dev("gpu-0", pcieSwitch="a"),
            dev("gpu-1", pcieSwitch="b"),
            dev("rdma-0", pcieSwitch="b"),
            dev("rdma-1", pcieSwitch="a"),
        )
    }
    chosen = {dra.TYPE_GPU: ["gpu-0", "gpu-1"], dra.TYPE_RDMA: ["rdma-0", "rdma-1"]}
    cands = [frozenset(devices)] * 4
    handed = assign(creq, chosen, cands, devices)
    assert handed is not None and satisfied(creq, handed, devices)
    by_request = {s.request: h for s, h in zip(creq.slots, handed, strict=True)}
    assert {by_request["g0"][0]: by_request["n0"][0], by_request["g1"][0]: by_request["n1"][0]} == {
        "gpu-0": "rdma-1",
        "gpu-1": "rdma-0",
    }


def test_no_hand_out_when_the_values_cannot_match() -> None:
    creq = request(
        spec(("g", dra.GPU_CLASS, 1), ("n", dra.RDMA_CLASS, 1), constraints=[{"matchAttribute": PCIE_SWITCH}])
    )
    devices = {d.name: d for d in (dev("gpu-0", pcieSwitch="a"), dev("rdma-0", pcieSwitch="b"))}
    assert (
        assign(creq, {dra.TYPE_GPU: ["gpu-0"], dra.TYPE_RDMA: ["rdma-0"]}, [frozenset(devices)] * 2, devices)
        is None
    )


def test_distinct_attribute_spreads_devices() -> None:
    creq = request(spec(("g", dra.GPU_CLASS, 2), constraints=[{"distinctAttribute": dra.NUMA_NODE}]))
    numa = dra.NUMA_NODE
    devices = {
        n: PublishedDevice(n, attributes={numa: v}) for n, v in (("gpu-0", 0), ("gpu-1", 0), ("gpu-2", 1))
    }
    handed = assign(creq, {dra.TYPE_GPU: ["gpu-0", "gpu-1", "gpu-2"]}, [frozenset(devices)], devices)
    assert handed is not None and sorted(handed[0]) == ["gpu-0", "gpu-2"]


def test_selectors_of_one_request_do_not_take_what_another_needs() -> None:
    creq = request(spec(("any", dra.GPU_CLASS, 1), ("h100", dra.GPU_CLASS, 1)))
    devices = {d.name: d for d in (dev("gpu-0"), dev("gpu-1"))}
    # Only gpu-0 is an H100: the first request must leave it to the second.
    handed = assign(
        creq, {dra.TYPE_GPU: ["gpu-0", "gpu-1"]}, [frozenset(devices), frozenset({"gpu-0"})], devices
    )
    assert handed == [("gpu-1",), ("gpu-0",)]
