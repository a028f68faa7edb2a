"""Input validation at the contract's edge (issue 18): the same inputs are refused with the same
words by every reader, because they all go through apis.documents and apis.podresources."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from allocator.core.request.parse import pod_request
from apis.device import Device
from apis.documents import load_documents, load_object, object_of_kind, single_object
from apis.errors import CodecError, InputError
from apis.podresources import device_quantity, is_extended_resource, resource_quantity
from apis.quantity import Quantity
from tests.core.pods import pod
from tests.support.machines import koordinator_example_device

# -- quantities ------------------------------------------------------------------------------------


def test_fractional_extended_resource_is_refused_not_rounded() -> None:
    with pytest.raises(CodecError, match=r"must be a whole number: nvidia\.com/gpu is an extended resource"):
        resource_quantity("nvidia.com/gpu", "1.5", "limits.nvidia.com/gpu")
    # Native resources may be fractional.
    assert resource_quantity("cpu", "1.5", "cpu") == Quantity.parse("1500m")
    assert resource_quantity("kubernetes.io/mid-cpu", "500m", "x").milli_value() == 500


@pytest.mark.parametrize(
    ("name", "extended"),
    [
        ("nvidia.com/gpu", True),
        ("koordinator.sh/gpu-core", True),
        ("cpu", False),
        ("hugepages-2Mi", False),
        ("kubernetes.io/mid-cpu", False),
        ("requests.nvidia.com/gpu", False),
    ],
)
def test_extended_resource_names(name: str, extended: bool) -> None:
    assert is_extended_resource(name) is extended


def test_negative_and_overflowing_quantities_are_refused() -> None:
    with pytest.raises(CodecError, match="must not be negative"):
        resource_quantity("memory", "-1Gi", "memory")
    with pytest.raises(CodecError, match="too large"):
        resource_quantity("nvidia.com/gpu", "1e21", "gpu")
    # The apimachinery-faithful parse still caps, for wire round trips.
    assert Quantity.parse("1e21").value() == 2**63 - 1


def test_pod_with_bad_quantities_is_invalid_with_the_field_named() -> None:
    cases = {
        "1.5": "must be a whole number",
        "-1": "must not be negative",
        "1e21": "too large",
    }
    for value, words in cases.items():
        req = pod_request(pod({"nvidia.com/gpu": value}))
        assert req.invalid is not None, value
        assert "nvidia.com/gpu" in req.invalid.message and words in req.invalid.message


def test_out_of_range_ratio_says_what_is_wrong() -> None:
    req = pod_request(pod({"koordinator.sh/gpu-memory-ratio": "150"}))
    assert req.invalid is not None
    assert req.invalid.message.startswith("koordinator.sh/gpu-memory-ratio is a percentage of one GPU")
    assert "unsupported combination" not in req.invalid.message
    huge = pod_request(pod({"koordinator.sh/gpu-memory-ratio": "1e30"}))
    assert huge.invalid is not None and "too large" in huge.invalid.message


# -- Device CR fields ------------------------------------------------------------------------------


def _device_with(change: dict) -> dict:
    dev = copy.deepcopy(koordinator_example_device())
    dev["spec"]["devices"][0].update(change)
    return dev


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"resources": {"koordinator.sh/gpu-core": "-100"}}, "gpu-core: must not be negative"),
        ({"resources": {"koordinator.sh/gpu-memory-ratio": "1e30"}}, "too large"),
        ({"resources": {"koordinator.sh/gpu-memory-ratio": "1000"}}, "percentage of one device"),
        ({"type": "tpu"}, "spec.devices[0].type: unknown device type (known: gpu, rdma, fpga)"),
        ({"type": "GPU"}, "unknown device type"),
    ],
)
def test_bad_device_fields_are_refused(change: dict, words: str) -> None:
    with pytest.raises(CodecError) as err:
        Device.from_dict(_device_with(change))
    assert words in str(err.value)


def test_device_quantity_accepts_the_real_values() -> None:
    assert device_quantity("koordinator.sh/gpu-core", "100", "x") == 100
    assert device_quantity("koordinator.sh/gpu-memory", "81559Mi", "x") == Quantity.parse("81559Mi")


# -- documents -------------------------------------------------------------------------------------


def test_non_utf8_file_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_bytes(b"kind: Pod\nmetadata: {name: caf\xe9}\n")
    with pytest.raises(InputError) as err:
        load_object(path, "pod file", "Pod")
    assert str(err.value) == f"pod file ({path}): not UTF-8 text (byte 0xe9 at offset 30)"


def test_utf16_with_bom_and_utf8_bom_decode(tmp_path: Path) -> None:
    for i, data in enumerate(
        ["kind: Pod\nmetadata: {name: é}\n".encode("utf-16"), b"\xef\xbb\xbfkind: Pod\nmetadata: {name: a}\n"]
    ):
        path = tmp_path / f"p{i}.yaml"
        path.write_bytes(data)
        assert load_object(path, "pod file", "Pod")["kind"] == "Pod"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "is empty: expected one Pod"),
        ("---\n---\n", "is empty: expected one Pod"),
        ("kind: Pod\n---\nkind: Pod\n", "holds 2 YAML documents: expected one Pod"),
        ("apiVersion: apps/v1\nkind: Deployment\n", "is a apps/v1 Deployment, not a Pod"),
        ("kind: List\nitems: []\n", "is a List: expected one Pod"),
        ("[1, 2]\n", "expected an object, not a list"),
    ],
)
def test_one_object_of_the_right_kind(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_object(path, "pod file", "Pod")
    assert err.value.why == why and err.value.where == str(path)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("kind: Pod\n---\nkind: Pod\n", "holds 2 YAML documents: expected one Pod, found 2 (documents 1, 2)"),
        ("kind: ResourceClaim\n---\n[1]\n", "holds 2 YAML documents (ResourceClaim, a list) and no Pod"),
        ("", "is empty: expected one Pod"),
        ("kind: Node\n", "is a Node, not a Pod"),
    ],
)
def test_the_one_object_of_a_kind_among_several_or_a_clear_refusal(
    tmp_path: Path, text: str, why: str
) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        object_of_kind(load_documents(path, "pod file"), "pod file", str(path), "Pod")
    assert err.value.why == why


def test_the_pod_beside_its_template_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "example.yaml"
    path.write_text("kind: ResourceClaimTemplate\nmetadata: {name: t}\n---\nkind: Pod\nmetadata: {name: p}\n")
    got = object_of_kind(load_documents(path, "pod file"), "pod file", str(path), "Pod")
    assert got["metadata"]["name"] == "p"


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text("kind: Device\nspec: {devices: [\n")
    with pytest.raises(InputError) as err:
        load_documents(path, "device file")
    assert err.value.where.startswith(f"{path}:") and "not valid YAML or JSON" in err.value.why


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read: No such file"):
        load_documents(tmp_path / "nope.yaml", "pod file")
    with pytest.raises(InputError, match="is a directory"):
        load_documents(tmp_path, "pod file")


def test_object_without_kind_is_taken_as_the_expected_one() -> None:
    assert single_object([{"spec": {}}], "pod file", "p.yaml", "Pod") == {"spec": {}}


def test_a_lone_E_is_the_exa_suffix_not_an_exponent() -> None:
    # Found by bench/fuzz.py: "1E" crashed the parser (ValueError from int('')), a 500 in the extender.
    assert Quantity.parse("1E").value() == 10**18
    assert str(Quantity.parse("2E")) == "2E"
    assert Quantity.parse("1e3").value() == 1000
