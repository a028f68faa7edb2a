"""Every codec round-trips, and malformed input raises the codec's own error naming field and value."""

from __future__ import annotations

import json

import pytest
from hypothesis import given

from apis import keys
from apis.annotations import (
    parse_device_allocate_hint,
    parse_device_allocated,
    parse_device_joint_allocate,
    parse_gpu_partition_spec,
    parse_numa_topology_spec,
)
from apis.device import Device
from apis.errors import CodecError
from apis.partitions import parse_gpu_partitions
from apis.podgroup import PodGroup, gang_of
from apis.selector import LabelSelector
from tests.apis import strategies as s


@given(s.device_allocations)
def test_device_allocated_round_trip(value) -> None:
    text = value.to_json()
    again = parse_device_allocated(text)
    assert again.to_json() == text


@given(s.hint_maps)
def test_allocate_hint_round_trip(value) -> None:
    text = value.to_json()
    assert parse_device_allocate_hint(text).to_json() == text


@given(s.joints)
def test_joint_allocate_round_trip(value) -> None:
    text = value.to_json()
    assert parse_device_joint_allocate(text).to_json() == text


@given(s.partition_specs)
def test_partition_spec_round_trip(value) -> None:
    text = value.to_json()
    assert parse_gpu_partition_spec(text).to_json() == text


@given(s.numa_specs)
def test_numa_spec_round_trip(value) -> None:
    text = value.to_json()
    assert parse_numa_topology_spec(text).to_json() == text


@given(s.partition_tables)
def test_partition_table_round_trip(value) -> None:
    text = value.to_json()
    assert parse_gpu_partitions(text).to_json() == text


@given(s.devices())
def test_device_round_trip(device: Device) -> None:
    data = json.loads(json.dumps(device.to_dict()))
    again = Device.from_dict(data)
    assert again.to_dict() == data


@given(s.podgroups)
def test_podgroup_round_trip(pg: PodGroup) -> None:
    data = json.loads(json.dumps(pg.to_dict()))
    assert PodGroup.from_dict(data).to_dict() == data


@given(s.selectors)
def test_selector_round_trip(sel: LabelSelector) -> None:
    data = sel.to_dict()
    assert LabelSelector.from_dict(data, "sel").to_dict() == data


def test_go_encoding_details() -> None:
    # resources written even when null, id and extension omitted when empty, VF minor 0 omitted.
    text = '{"rdma":[{"minor":0,"resources":null,"extension":{"vfs":[{"busID":"0000:1a:00.2"}]}}]}'
    assert parse_device_allocated(text).to_json() == text
    text = '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"50"},"extension":{}}]}'
    assert parse_device_allocated(text).to_json() == text
    # map keys sorted; HTML characters escaped as Go does
    alloc = parse_device_allocated(
        '{"rdma":[{"minor":0,"resources":{}}],"gpu":[{"minor":0,"resources":{},"id":"a<b>&c"}]}'
    )
    assert (
        alloc.to_json()
        == '{"gpu":[{"minor":0,"resources":{},"id":"a\\u003cb\\u003e\\u0026c"}],"rdma":[{"minor":0,"resources":{}}]}'
    )


def test_quantities_in_annotations_are_canonicalised() -> None:
    text = '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"85520809984","koordinator.sh/gpu-core":100}}]}'
    alloc = parse_device_allocated(text)
    # Numbers are accepted like Go's Quantity.UnmarshalJSON; output is canonical strings, sorted keys.
    assert (
        alloc.to_json()
        == '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"85520809984"}}]}'
    )


def test_go_style_case_insensitive_keys() -> None:
    alloc = parse_device_allocated('{"gpu":[{"Minor":2,"Resources":{}}]}')
    assert alloc.minors("gpu") == [2]
    hint = parse_device_allocate_hint('{"gpu":{"RequiredTopologyScope":"PCIe"}}')
    assert hint.get("gpu").required_topology_scope == "PCIe"


def test_pciexpresslevel_alias_is_kept_verbatim() -> None:
    text = '{"rdma":{"vfSelector":{},"exclusivePolicy":"PCIExpressLevel"}}'
    hint = parse_device_allocate_hint(text)
    assert hint.get("rdma").pcie_exclusive
    assert hint.to_json() == text


MALFORMED = [
    (parse_device_allocated, "not json", keys.DEVICE_ALLOCATED, "invalid JSON"),
    (
        parse_device_allocated,
        '{"gpu":[{"minor":-1,"resources":{}}]}',
        "device-allocated.gpu[0].minor",
        "between 0",
    ),
    (
        parse_device_allocated,
        '{"gpu":[{"minor":"1","resources":{}}]}',
        "device-allocated.gpu[0].minor",
        "integer",
    ),
    (parse_device_allocated, '{"gpu":[{"resources":{}}]}', "device-allocated.gpu[0].minor", "required"),
    (parse_device_allocated, '{"gpu":{"minor":1}}', "device-allocated.gpu", "list"),
    (
        parse_device_allocated,
        '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"lots"}}]}',
        "device-allocated.gpu[0].resources.koordinator.sh/gpu-core",
        "quantity",
    ),
    (parse_device_allocated, "[]", keys.DEVICE_ALLOCATED, "object"),
    (
        parse_device_allocate_hint,
        '{"gpu":{"requiredTopologyScope":"Rack"}}',
        "device-allocate-hint.gpu.requiredTopologyScope",
        "one of",
    ),
    (
        parse_device_allocate_hint,
        '{"gpu":{"allocateStrategy":"All"}}',
        "device-allocate-hint.gpu.allocateStrategy",
        "one of",
    ),
    (
        parse_device_allocate_hint,
        '{"rdma":{"exclusivePolicy":"NodeLevel"}}',
        "device-allocate-hint.rdma.exclusivePolicy",
        "one of",
    ),
    (
        parse_device_allocate_hint,
        '{"rdma":{"vfSelector":{"matchExpressions":[{"key":"type","operator":"In"}]}}}',
        "device-allocate-hint.rdma.vfSelector.matchExpressions[0].values",
        "non-empty",
    ),
    (
        parse_device_allocate_hint,
        '{"gpu":{"selector":{"matchExpressions":[{"key":"t","operator":"Near","values":["a"]}]}}}',
        "device-allocate-hint.gpu.selector.matchExpressions[0].operator",
        "one of",
    ),
    (
        parse_device_allocate_hint,
        '{"gpu":{"selector":{"matchLabels":{"bad key!":"x"}}}}',
        "matchLabels.bad key!",
        "label key",
    ),
    (parse_device_allocate_hint, '{"gpu":{"selector":{"matchLabels":{"k":7}}}}', "matchLabels.k", "string"),
    (parse_device_joint_allocate, '{"deviceTypes":"gpu"}', "device-joint-allocate.deviceTypes", "list"),
    (
        parse_device_joint_allocate,
        '{"deviceTypes":["gpu"],"requiredScope":"SameNUMA"}',
        "device-joint-allocate.requiredScope",
        "one of",
    ),
    (parse_gpu_partition_spec, '{"allocatePolicy":"Strict"}', "gpu-partition-spec.allocatePolicy", "one of"),
    (
        parse_gpu_partition_spec,
        '{"ringBusBandwidth":"fast"}',
        "gpu-partition-spec.ringBusBandwidth",
        "quantity",
    ),
    (
        parse_numa_topology_spec,
        '{"numaTopologyPolicy":"Strict"}',
        "numa-topology-spec.numaTopologyPolicy",
        "one of",
    ),
    (parse_gpu_partitions, "null", keys.GPU_PARTITIONS, "not null"),
    (parse_gpu_partitions, '{"two":[]}', "gpu-partitions.two", "decimal"),
    (parse_gpu_partitions, '{"2":[{"minors":[0,-1]}]}', "gpu-partitions.2[0].minors[1]", "non-negative"),
    (
        parse_gpu_partitions,
        '{"2":[{"minors":[0,1],"allocationScore":"high"}]}',
        "gpu-partitions.2[0].allocationScore",
        "integer",
    ),
]


@pytest.mark.parametrize(("parse", "text", "field", "problem"), MALFORMED)
def test_malformed_annotations_raise_codec_error(parse, text: str, field: str, problem: str) -> None:
    with pytest.raises(CodecError) as exc:
        parse(text)
    assert field in exc.value.field
    assert problem in str(exc.value)


DEVICE_OK = {
    "apiVersion": "scheduling.koordinator.sh/v1alpha1",
    "kind": "Device",
    "metadata": {"name": "n1"},
    "spec": {
        "devices": [
            {"type": "gpu", "minor": 0, "health": True, "resources": {"koordinator.sh/gpu-core": "100"}}
        ]
    },
}


def _bad_device(path: list, value) -> dict:
    obj = json.loads(json.dumps(DEVICE_OK))
    target = obj
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return obj


@pytest.mark.parametrize(
    ("path", "value", "field", "problem"),
    [
        (["spec", "devices", 0, "minor"], -3, "spec.devices[0].minor", "between 0"),
        (["spec", "devices", 0, "minor"], "zero", "spec.devices[0].minor", "integer"),
        (["spec", "devices", 0, "health"], "yes", "spec.devices[0].health", "true or false"),
        (["spec", "devices", 0, "type"], 3, "spec.devices[0].type", "string"),
        (
            ["spec", "devices", 0, "resources"],
            {"koordinator.sh/gpu-core": "1x"},
            "resources.koordinator.sh/gpu-core",
            "quantity",
        ),
        (
            ["spec", "devices", 0, "topology"],
            {"nodeID": -2, "socketID": 0, "pcieID": "p"},
            "topology.nodeID",
            "between -1",
        ),
        (
            ["spec", "devices", 0, "vfGroups"],
            [{"vfs": [{"minor": "a"}]}],
            "vfGroups[0].vfs[0].minor",
            "integer",
        ),
        (["spec", "devices"], {"type": "gpu"}, "spec.devices", "list"),
        (["kind"], "Node", "kind", "expected Device"),
    ],
)
def test_malformed_device_raises_codec_error(path: list, value, field: str, problem: str) -> None:
    with pytest.raises(CodecError) as exc:
        Device.from_dict(_bad_device(path, value))
    assert field in exc.value.field
    assert problem in str(exc.value)


def test_duplicate_minor_is_rejected() -> None:
    obj = json.loads(json.dumps(DEVICE_OK))
    obj["spec"]["devices"].append(dict(obj["spec"]["devices"][0]))
    with pytest.raises(CodecError, match="duplicate minor"):
        Device.from_dict(obj)


def test_numa_unknown_is_kept() -> None:
    obj = json.loads(json.dumps(DEVICE_OK))
    obj["spec"]["devices"][0]["topology"] = {"socketID": -1, "nodeID": -1, "pcieID": "pci0000:00"}
    dev = Device.from_dict(obj)
    assert dev.devices[0].topology.node_id == -1
    assert dev.to_dict()["spec"]["devices"][0]["topology"]["nodeID"] == -1


def test_gang_membership_sources() -> None:
    pod = {"metadata": {"namespace": "ml", "labels": {keys.POD_GROUP_LABEL: "job-a"}}}
    assert gang_of(pod).key == "ml/job-a"
    pod = {"metadata": {"labels": {keys.POD_GROUP_LABEL_LEGACY: "old"}}}
    assert gang_of(pod).source == "podgroup-legacy"
    pod = {
        "metadata": {"namespace": "rl", "annotations": {keys.GANG_NAME: "g", keys.GANG_MIN_AVAILABLE: "4"}}
    }
    ref = gang_of(pod)
    assert (ref.key, ref.min_available, ref.source) == ("rl/g", 4, "koordinator")
    assert gang_of({"metadata": {}}) is None
    with pytest.raises(CodecError, match="positive integer"):
        gang_of({"metadata": {"annotations": {keys.GANG_NAME: "g", keys.GANG_MIN_AVAILABLE: "four"}}})
