"""Property tests over generated bad input (issue 18), a bounded number per run: the decoders
refuse only with their documented error, the core's pod parser never raises, and the CLI answers
any file with an exit status of the convention and no traceback. The same generators drive
bench/fuzz.py's 100,000-input campaign."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.core.node.inventory import build_inventory
from allocator.core.request.parse import pod_request
from apis import annotations as ann
from apis import keys
from apis.device import Device
from apis.documents import decode_text, parse_yaml_documents, single_object
from apis.errors import CodecError, InputError
from apis.extender import ExtenderArgs
from tests.support import fuzzing as fz
from tests.support.machines import machine_device
from topoalloc.cli import main

BASE = machine_device("dgx-h100", "fuzz-node")
PARSERS = {
    keys.DEVICE_ALLOCATE_HINT: ann.parse_device_allocate_hint,
    keys.DEVICE_JOINT_ALLOCATE: ann.parse_device_joint_allocate,
    keys.GPU_PARTITION_SPEC: ann.parse_gpu_partition_spec,
    keys.NUMA_TOPOLOGY_SPEC: ann.parse_numa_topology_spec,
    keys.DEVICE_ALLOCATED: ann.parse_device_allocated,
}
FAST = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@FAST
@given(rng=st.randoms(use_true_random=False))
def test_pod_request_never_raises_and_an_invalid_pod_says_why(rng: random.Random) -> None:
    req = pod_request(fz.pod(rng))
    if req.invalid is not None:
        assert req.invalid.message and req.invalid.code


@FAST
@given(key=st.sampled_from(sorted(PARSERS)), text=st.text(max_size=60) | st.sampled_from(fz.ODD_STRINGS))
def test_annotation_parsers_refuse_only_with_codec_errors(key: str, text: str) -> None:
    try:
        PARSERS[key](text)
    except CodecError as exc:
        assert exc.field.startswith(key)


@FAST
@given(rng=st.randoms(use_true_random=False))
def test_mangled_annotations_become_a_reason_naming_the_annotation(rng: random.Random) -> None:
    key = rng.choice(sorted(fz.ANNOTATIONS))
    raw = fz.mutate_string(rng, rng.choice(fz.ANNOTATIONS[key]))
    try:
        PARSERS[key](raw)
    except CodecError:
        pod = {"metadata": {"name": "p", "annotations": {key: raw}},
               "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1", "koordinator.sh/rdma": "1"}}}]}}  # fmt: skip
        req = pod_request(pod)
        if key != keys.NUMA_TOPOLOGY_SPEC or req.invalid is not None:
            assert req.invalid is not None and key in req.invalid.message


@FAST
@given(rng=st.randoms(use_true_random=False))
def test_device_crs_decode_or_refuse_with_the_field(rng: random.Random) -> None:
    raw = fz.device(rng, BASE)
    try:
        device = Device.from_dict(raw)
    except CodecError as exc:
        assert str(exc)
        with pytest.raises(CodecError):  # the core refuses the same Device the same way
            build_inventory(raw)
        return
    again = Device.from_dict(device.to_dict())
    assert again.to_dict() == device.to_dict()
    build_inventory(raw)


@FAST
@given(rng=st.randoms(use_true_random=False))
def test_extender_bodies_decode_or_refuse(rng: random.Random) -> None:
    body = {"Pod": fz.pod(rng), "Nodes": None, "NodeNames": ["a", "b"]}
    with contextlib.suppress(CodecError):
        ExtenderArgs.from_dict(fz.mutate_tree(rng, body, rounds=rng.randint(0, 3)))


@FAST
@given(rng=st.randoms(use_true_random=False))
def test_file_bytes_decode_or_refuse_with_an_input_error(rng: random.Random) -> None:
    data = fz.document_bytes(rng, lambda: fz.pod(rng))
    try:
        single_object(
            parse_yaml_documents(decode_text(data, "pod file", "f"), "pod file", "f"), "pod file", "f", "Pod"
        )
    except InputError as exc:
        assert exc.what == "pod file" and exc.why


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(rng=st.randoms(use_true_random=False))
def test_allocate_answers_any_pod_file_by_the_convention(
    rng: random.Random, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path: Path = tmp_path_factory.mktemp("fuzz") / "pod.yaml"
    path.write_bytes(fz.document_bytes(rng, lambda: fz.pod(rng)))
    device = Path(__file__).resolve().parents[2] / "hw-fixtures" / "dgx-h100" / "expected-device.yaml"
    ran = CliRunner().invoke(main, ["allocate", "--device", str(device), "--pod", str(path)])
    assert isinstance(ran.exception, SystemExit | None)
    assert ran.exit_code in (0, 1, 2)
    assert "Traceback" not in ran.output
    if ran.exit_code == 2:
        assert ran.stderr.startswith("error: ") and ran.stdout == ""
