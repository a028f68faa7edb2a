"""Every JSON example in the protocol doc round-trips through the codecs unchanged."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from apis import keys
from apis.annotations import (
    parse_device_allocate_hint,
    parse_device_allocated,
    parse_device_joint_allocate,
    parse_gpu_partition_spec,
)
from apis.device import Device
from apis.partitions import parse_gpu_partitions
from tests.apis.paths import PROTOCOL_DOC, require_shared

require_shared()
DOC = PROTOCOL_DOC.read_text()


def _fenced(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC, re.S)


def test_device_example_round_trips() -> None:
    (block,) = [b for b in _fenced("json") if '"kind": "Device"' in b]
    obj = json.loads(block)
    device = Device.from_dict(obj)
    assert device.to_dict() == obj
    assert len(list(device.of_type("gpu"))) == 8
    assert len(list(device.of_type("rdma"))) == 4
    # The embedded partition table is canonical Go output: byte-identical.
    table = obj["metadata"]["annotations"][keys.GPU_PARTITIONS]
    assert parse_gpu_partitions(table).to_json() == table


def test_worked_example_annotations_round_trip_byte_identical() -> None:
    (pod_yaml,) = _fenced("yaml")
    pod = yaml.safe_load(pod_yaml)
    ann = pod["metadata"]["annotations"]
    for key, parse in (
        (keys.DEVICE_ALLOCATE_HINT, parse_device_allocate_hint),
        (keys.DEVICE_JOINT_ALLOCATE, parse_device_joint_allocate),
        (keys.GPU_PARTITION_SPEC, parse_gpu_partition_spec),
    ):
        assert parse(ann[key]).to_json() == ann[key]
    (allocated,) = [b.strip() for b in _fenced("json") if b.lstrip().startswith('{"gpu"')]
    assert parse_device_allocated(allocated).to_json() == allocated


@pytest.mark.parametrize(
    ("snippet", "parse"),
    [
        ('{"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"}', parse_device_joint_allocate),
    ],
)
def test_spaced_examples_are_semantically_unchanged(snippet: str, parse) -> None:
    assert snippet in DOC
    assert json.loads(parse(snippet).to_json()) == json.loads(snippet)


def test_every_inline_json_object_in_the_doc_is_covered() -> None:
    # Inline one-line JSON examples that parse: each must round-trip through the matching codec.
    codecs = {
        '"resources"': parse_device_allocated,
        '"deviceTypes"': parse_device_joint_allocate,
        '"allocatePolicy"': parse_gpu_partition_spec,
        '"minors"': parse_gpu_partitions,
    }
    checked = 0
    for line in re.findall(r"^(\{.*\})\s*(?://.*)?$", DOC, re.M):
        try:
            obj = json.loads(line)
        except ValueError:
            continue  # pseudo-JSON with placeholders such as <n> or A | B
        parse = next((p for marker, p in codecs.items() if marker in line), None)
        assert parse is not None, f"no codec for doc example {line}"
        assert json.loads(parse(line).to_json()) == obj
        if " " not in line:  # written compactly, i.e. as Go writes it: byte-identical
            assert parse(line).to_json() == line
        checked += 1
    assert checked >= 1
