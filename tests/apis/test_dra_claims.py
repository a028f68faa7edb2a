"""apis/dra_claims.py and apis/dra_slices.py: the DRA objects the allocator reads, and what it writes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from apis import dra
from apis.dra_claims import (
    ALL,
    DeviceClass,
    DeviceResult,
    ResourceClaim,
    ResourceClaimTemplate,
    allocation_status,
    claim_name,
    pod_claims,
)
from apis.dra_slices import ResourceSlice
from apis.errors import CodecError


def claim(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
        "spec": {"devices": spec},
    }


PAIR = {
    "requests": [
        {"name": "gpu", "exactly": {"deviceClassName": dra.GPU_CLASS}},
        {
            "name": "nic",
            "exactly": {"deviceClassName": dra.RDMA_CLASS, "selectors": [{"cel": {"expression": "true"}}]},
        },
    ],
    "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": "topoalloc.io/pcieSwitch"}],
}


def test_claim_spec_is_read_with_defaults() -> None:
    c = ResourceClaim.from_dict(claim(**PAIR))
    assert (c.key, c.uid, c.resource_version) == ("ns/c", "u1", "7")
    gpu, nic = c.spec.requests
    assert gpu.exactly is not None and (gpu.exactly.count, gpu.exactly.mode) == (1, "ExactCount")
    assert nic.exactly is not None and nic.exactly.selectors == ("true",)
    assert c.spec.constraints[0].requests == ("gpu", "nic")
    assert c.spec.classes == {dra.GPU_CLASS, dra.RDMA_CLASS}
    assert c.allocation is None and not c.opted_out


def test_all_mode_has_no_count_and_first_available_is_kept() -> None:
    c = ResourceClaim.from_dict(
        claim(
            requests=[
                {"name": "a", "exactly": {"deviceClassName": "x", "allocationMode": ALL}},
                {"name": "b", "firstAvailable": [{"name": "big", "deviceClassName": "y", "count": 2}]},
            ]
        )
    )
    a, b = c.spec.requests
    assert a.exactly is not None and a.exactly.count == 0
    assert b.exactly is None and b.first_available[0][0] == "big" and b.first_available[0][1].count == 2


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda s: s["requests"][0].pop("exactly"), r"spec\.devices\.requests\[0\]"),
        (lambda s: s["requests"][0]["exactly"].update(count=0), r"requests\[0\]\.exactly\.count"),
        (lambda s: s["requests"][0]["exactly"].update(count="2"), r"requests\[0\]\.exactly\.count"),
        (lambda s: s["requests"][0]["exactly"].update(allocationMode="Some"), r"exactly\.allocationMode"),
        (lambda s: s["requests"][0]["exactly"].pop("deviceClassName"), r"exactly\.deviceClassName"),
        (
            lambda s: s["requests"][1]["exactly"].update(selectors=[{"cel": {}}]),
            r"selectors\[0\]\.cel\.expression",
        ),
        (lambda s: s["requests"].append(dict(s["requests"][0])), r"requests: request names must be unique"),
        (lambda s: s["constraints"][0].update(requests=["gpu", "nope"]), r"constraints\[0\]\.requests"),
        (
            lambda s: s["constraints"][0].update(matchAttribute="pcieSwitch"),
            r"matchAttribute: must be a fully",
        ),
        (
            lambda s: s["constraints"][0].update(distinctAttribute="a/b"),
            r"constraints\[0\]: needs exactly one",
        ),
        (lambda s: s.update(config=[{"opaque": {}}]), r"config\[0\]\.opaque\.driver"),
    ],
)
def test_malformed_claims_name_the_field(mutate: Any, field: str) -> None:
    spec = copy.deepcopy(PAIR)
    mutate(spec)
    with pytest.raises(CodecError, match=field):
        ResourceClaim.from_dict(claim(**spec))


def test_allocation_and_reservations_are_read() -> None:
    obj = claim(**PAIR)
    results = [
        DeviceResult("gpu", dra.DRIVER, "n1", "gpu-3"),
        DeviceResult("nic", dra.DRIVER, "n1", "rdma-3"),
    ]
    obj["metadata"]["annotations"] = {dra.ALLOCATED_BY_ANNOTATION: dra.ALLOCATED_BY}
    obj["status"] = {
        "allocation": allocation_status(results, "n1"),
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}],
    }
    c = ResourceClaim.from_dict(obj)
    assert c.allocation is not None and c.allocation.node == "n1"
    assert list(c.allocation.results) == results
    assert c.reserved_for[0].name == "p" and c.allocated_by_us
    # The shape kube-scheduler writes: one matchFields term.
    assert allocation_status(results, "n1")["nodeSelector"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    }


def test_a_status_change_keeps_the_spec_decoded_for_the_same_claim() -> None:
    first = ResourceClaim.from_dict(claim(**PAIR))
    later = claim(**PAIR)
    later["metadata"]["resourceVersion"] = "8"
    later["status"] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}]}
    again = ResourceClaim.from_dict(later, earlier=first)
    assert again.spec is first.spec  # not decoded again: a claim's spec is immutable
    assert again.resource_version == "8" and again.reserved_for[0].uid == "pu"
    # Another claim of that name (a new uid) is decoded whole, its own spec read.
    other = claim(requests=[{"name": "gpu", "exactly": {"deviceClassName": dra.GPU_CLASS, "count": 2}}])
    other["metadata"]["uid"] = "u2"
    fresh = ResourceClaim.from_dict(other, earlier=first)
    assert fresh.spec is not first.spec and [r.name for r in fresh.spec.requests] == ["gpu"]
    assert fresh.spec.requests[0].exactly is not None and fresh.spec.requests[0].exactly.count == 2


def test_a_selector_of_another_shape_names_no_node() -> None:
    obj = claim(**PAIR)
    obj["status"] = {
        "allocation": {
            "devices": {"results": []},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            },
        }
    }
    c = ResourceClaim.from_dict(obj)
    assert c.allocation is not None and c.allocation.node == ""


def test_template_annotations_come_from_its_spec_metadata() -> None:
    obj = {
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {
            "metadata": {"annotations": {dra.ALLOCATOR_ANNOTATION: dra.ALLOCATOR_KUBE_SCHEDULER}},
            "spec": {"devices": PAIR},
        },
    }
    t = ResourceClaimTemplate.from_dict(obj)
    assert t.opted_out and t.key == "ns/t" and len(t.spec.requests) == 2
    obj["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = -1
    with pytest.raises(CodecError, match=r"spec\.spec\.devices\.requests\[0\]\.exactly\.count"):
        ResourceClaimTemplate.from_dict(obj)


def test_device_class_selectors_and_config_drivers() -> None:
    cls = DeviceClass.from_dict(
        {
            "metadata": {"name": dra.GPU_CLASS},
            "spec": {
                "selectors": [{"cel": {"expression": 'device.driver == "topoalloc.io"'}}],
                "config": [{"opaque": {"driver": "x.example.com", "parameters": {}}}],
            },
        }
    )
    assert cls.selectors == ('device.driver == "topoalloc.io"',) and cls.config_drivers == ("x.example.com",)
    with pytest.raises(CodecError, match=r"metadata\.name"):
        DeviceClass.from_dict({"spec": {}})


def test_pod_claims_follow_the_generated_claim_names() -> None:
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "gpus", "resourceClaimTemplateName": "t"},
                {"name": "shared", "resourceClaimName": "s"},
                {"name": "later", "resourceClaimTemplateName": "t2"},
            ]
        },
        "status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "p-gpus-x7"}]},
    }
    gpus, shared, later = pod_claims(pod)
    assert claim_name(gpus) == "p-gpus-x7" and claim_name(shared) == "s" and claim_name(later) is None
    pod["spec"]["resourceClaims"][0]["resourceClaimName"] = "both"
    with pytest.raises(CodecError, match=r"spec\.resourceClaims\[0\]: needs exactly one"):
        pod_claims(pod)


def test_slices_qualify_driver_attributes_and_read_capacity() -> None:
    s = ResourceSlice.from_dict(
        {
            "metadata": {"name": "n1-topoalloc.io-0"},
            "spec": {
                "driver": dra.DRIVER,
                "pool": {"name": "n1", "generation": 3, "resourceSliceCount": 1},
                "nodeName": "n1",
                "devices": [
                    {
                        "name": "gpu-0",
                        "attributes": {"type": {"string": "gpu"}, dra.NUMA_NODE: {"int": 0}},
                        "capacity": {"memory": {"value": "80Gi"}},
                    }
                ],
            },
        }
    )
    assert (s.pool, s.generation, s.node) == ("n1", 3, "n1")
    dev = s.devices[0]
    assert dict(dev.attributes) == {"topoalloc.io/type": "gpu", dra.NUMA_NODE: 0}
    assert dict(dev.capacity) == {"topoalloc.io/memory": 80 * 2**30 * 1000}


@pytest.mark.parametrize(
    ("attribute", "field"),
    [
        ({"int": 1, "string": "x"}, r"attributes\.a: needs exactly one"),
        ({"int": "1"}, r"attributes\.a\.int: expected a value of type int"),
        ({"bool": 1}, r"attributes\.a\.bool"),
    ],
)
def test_malformed_slice_attributes_name_the_field(attribute: dict[str, Any], field: str) -> None:
    obj = {
        "metadata": {"name": "s"},
        "spec": {
            "driver": dra.DRIVER,
            "pool": {"name": "p"},
            "devices": [{"name": "d", "attributes": {"a": attribute}}],
        },
    }
    with pytest.raises(CodecError, match=field):
        ResourceSlice.from_dict(obj)


def test_the_default_classes_are_the_ones_deploy_ships() -> None:
    from pathlib import Path

    import yaml

    from apis.dra_claims import default_classes

    path = Path(__file__).resolve().parents[2] / "deploy" / "dra" / "deviceclasses.yaml"
    shipped = {
        d["metadata"]["name"]: DeviceClass.from_dict(d) for d in yaml.safe_load_all(path.read_text()) if d
    }
    assert shipped == default_classes()
