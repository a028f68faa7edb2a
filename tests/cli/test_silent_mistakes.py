"""Mistakes `topoalloc allocate` used to take without a word: a misspelt annotation key (warned,
with the key meant), an unknown device type to allocate jointly (refused, like a misspelt scope),
a resource name close to a device resource (refused with the name meant), a DRA pod placed without
its claims (warned); `--strict` makes any warning an error."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli.conftest import DGX_DEVICE, REPO, Ran

Run = Callable[..., Ran]
JOINT = "scheduling.koordinator.sh/device-joint-allocate"


def write_pod(tmp_path: Path, requests: dict[str, str], annotations: dict[str, str] | None = None) -> Path:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": annotations or {}},
        "spec": {"containers": [{"name": "c", "resources": {"requests": requests, "limits": requests}}]},
    }
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    return path


GPU_NIC = {"nvidia.com/gpu": "2", "koordinator.sh/rdma": "1"}


def test_a_misspelt_annotation_key_is_warned_and_strict_refuses_it(topoalloc: Run, tmp_path: Path) -> None:
    pod = write_pod(
        tmp_path, GPU_NIC, {JOINT.replace("allocate", "alocate"): '{"deviceTypes":["gpu","rdma"]}'}
    )
    ran = topoalloc("allocate", "--device", DGX_DEVICE, "--pod", pod)
    assert ran.code == 0, ran.stderr
    assert ran.stderr == (
        f"warning: pod file ({pod}): unknown annotation scheduling.koordinator.sh/device-joint-alocate "
        "(did you mean scheduling.koordinator.sh/device-joint-allocate?): topoalloc ignores it\n"
    )
    strict = topoalloc("allocate", "--device", DGX_DEVICE, "--pod", pod, "--strict")
    assert strict.code == 2 and strict.stdout == ""
    assert strict.stderr.splitlines()[-1] == "error: --strict: 1 warning(s) about the inputs, above"


def test_an_unknown_device_type_to_allocate_jointly_is_refused(topoalloc: Run, tmp_path: Path) -> None:
    pod = write_pod(tmp_path, GPU_NIC, {JOINT: '{"deviceTypes":["gpu","nic"]}'})
    ran = topoalloc("allocate", "--device", DGX_DEVICE, "--pod", pod, "--explain")
    assert ran.code == 2 and ran.clean_error, ran
    assert ran.stderr.strip() == (
        f"error: pod file ({pod}): invalid {JOINT} annotation: deviceTypes[1]: must be one of gpu, rdma, "
        "fpga (got 'nic')"
    )


@pytest.mark.parametrize("name", ["nvida.com/gpu", "nvidia.com/GPU"])
def test_a_resource_name_close_to_a_gpu_resource_is_refused(
    topoalloc: Run, tmp_path: Path, name: str
) -> None:
    ran = topoalloc("allocate", "--device", DGX_DEVICE, "--pod", write_pod(tmp_path, {name: "2"}))
    assert ran.code == 2 and ran.clean_error, ran
    assert f"unknown resource {name} (did you mean nvidia.com/gpu?)" in ran.stderr


def test_a_dra_pod_without_its_claims_is_warned(topoalloc: Run) -> None:
    example = REPO / "examples" / "dra" / "gpu.yaml"
    ran = topoalloc("allocate", "--device", DGX_DEVICE, "--pod", example)
    assert ran.code == 0 and "the pod's DRA claims (gpu) are not given" in ran.stderr
    assert topoalloc("allocate", "--device", DGX_DEVICE, "--pod", example, "--strict").code == 2
    claimed = topoalloc("allocate", "--device", DGX_DEVICE, "--pod", example, "--claim", example, "--strict")
    assert claimed.code == 0 and claimed.stderr == ""
