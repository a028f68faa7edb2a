"""`topoalloc allocate --claim`: a pod's DRA claims allocated on one node from files, the allocation
printed as the allocator would write it, --explain, and the error convention for bad claims."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from agent.dra.slices import pool_devices, pool_slices
from apis.device import Device
from tests.cli.conftest import DGX_DEVICE, REPO, Ran

DGX1 = REPO / "hw-fixtures" / "dgx1-v100" / "expected-device.yaml"
EXAMPLES = REPO / "examples" / "dra"
Topoalloc = Callable[..., Ran]


def write(tmp_path: Path, name: str, *docs: Any) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs))
    return path


def pod(tmp_path: Path) -> Path:
    return write(
        tmp_path,
        "pod.yaml",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        },
    )


def gpus(
    count: int, *, extra: dict[str, Any] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    exactly = {"deviceClassName": "gpu.topoalloc.io", "count": count, **(extra or {})}
    meta: dict[str, Any] = {"name": "c", "namespace": "ns"}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": [{"name": "g", "exactly": exactly}]}},
    }


def test_an_example_template_prints_the_allocation_as_written(topoalloc: Topoalloc, tmp_path: Path) -> None:
    ran = topoalloc(
        "allocate", "--device", DGX1, "--pod", pod(tmp_path), "--claim", EXAMPLES / "gpu-nic-x4.yaml"
    )
    assert ran.code == 0, ran.stderr
    alloc = yaml.safe_load(ran.stdout)["gpu-nic-x4"]
    results = alloc["devices"]["results"]
    assert [r["request"] for r in results] == [
        "gpu-0",
        "nic-0",
        "gpu-1",
        "nic-1",
        "gpu-2",
        "nic-2",
        "gpu-3",
        "nic-3",
    ]
    assert {r["driver"] for r in results} == {"topoalloc.io"}
    assert alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["dgx1-v100"]


def test_explain_shows_candidates_constraints_and_the_choice(topoalloc: Topoalloc, tmp_path: Path) -> None:
    ran = topoalloc(
        "allocate",
        "--device",
        DGX1,
        "--pod",
        pod(tmp_path),
        "--claim",
        EXAMPLES / "nvlink-pair.yaml",
        "--explain",
    )
    assert ran.code == 0
    assert "claim ns/nvlink-pair, request gpus (2 x gpu): candidates gpu-0" in ran.stderr
    assert "constraint matchAttribute topoalloc.io/nvlinkPartition2 over gpus" in ran.stderr
    assert "claim ns/nvlink-pair, request gpus: gpu-" in ran.stderr


def test_a_claim_that_does_not_fit_exits_1_with_the_reason(topoalloc: Topoalloc, tmp_path: Path) -> None:
    ran = topoalloc(
        "allocate", "--device", DGX1, "--pod", pod(tmp_path), "--claim", write(tmp_path, "c.yaml", gpus(9))
    )
    assert ran.code == 1 and "need 9" in ran.stdout


def test_a_malformed_claim_is_bad_input(topoalloc: Topoalloc, tmp_path: Path) -> None:
    ran = topoalloc(
        "allocate", "--device", DGX1, "--pod", pod(tmp_path), "--claim", write(tmp_path, "c.yaml", gpus(0))
    )
    assert ran.code == 2 and ran.clean_error
    assert "claim file" in ran.stderr and "spec.devices.requests[0].exactly.count" in ran.stderr
    ran = topoalloc(
        "allocate",
        "--device",
        DGX1,
        "--pod",
        pod(tmp_path),
        "--claim",
        write(tmp_path, "p.yaml", {"kind": "Pod"}),
    )
    assert ran.code == 2 and "holds no ResourceClaim" in ran.stderr


def test_claims_left_to_kube_scheduler_and_refused_selectors(topoalloc: Topoalloc, tmp_path: Path) -> None:
    out = write(tmp_path, "o.yaml", gpus(1, annotations={"topoalloc.io/allocator": "kube-scheduler"}))
    ran = topoalloc(
        "allocate", "--device", DGX1, "--pod", pod(tmp_path), "--claim", out, "--explain", "-o", "json"
    )
    assert ran.code == 0 and "opts out" in ran.stderr
    semver = write(
        tmp_path,
        "s.yaml",
        gpus(
            1,
            extra={"selectors": [{"cel": {"expression": 'semver("1.0.0").isGreaterThan(semver("0.1.0"))'}}]},
        ),
    )
    ran = topoalloc("allocate", "--device", DGX1, "--pod", pod(tmp_path), "--claim", semver)
    assert ran.code == 1 and "unsupported selector" in ran.stdout


def test_the_slices_given_bound_the_choice(topoalloc: Topoalloc, tmp_path: Path) -> None:
    device = yaml.safe_load(DGX1.read_text())
    devices = [
        d for d in pool_devices(Device.from_dict(device), max_vfs=8) if d["name"] not in ("gpu-0", "gpu-3")
    ]
    slices = write(tmp_path, "slices.yaml", *pool_slices("dgx1-v100", devices, 1))
    ran = topoalloc(
        "allocate",
        "--device",
        DGX1,
        "--pod",
        pod(tmp_path),
        "--claim",
        write(tmp_path, "c.yaml", gpus(6)),
        "--slices",
        slices,
    )
    assert ran.code == 0, ran.stdout
    got = {r["device"] for r in yaml.safe_load(ran.stdout)["c"]["devices"]["results"]}
    assert not got & {"gpu-0", "gpu-3"} and len(got) == 6


def test_each_example_file_is_its_own_pod_and_claim(topoalloc: Topoalloc) -> None:
    """Every DRA example holds its template and its pod: `--pod F --claim F` takes the Pod for
    --pod and the template for --claim from the one file."""
    examples = sorted(EXAMPLES.glob("*.yaml"))
    assert len(examples) >= 5
    for example in examples:
        ran = topoalloc(
            "allocate", "--device", DGX_DEVICE, "--pod", example, "--claim", example, "-o", "json"
        )
        assert ran.code == 0, (example.name, ran.stderr)
        [template] = [d for d in yaml.safe_load_all(example.read_text()) if d["kind"] != "Pod"]
        assert list(yaml.safe_load(ran.stdout)["claims"]) == [template["metadata"]["name"]]


def test_a_pod_file_with_two_pods_or_none_is_refused_as_ambiguous(
    topoalloc: Topoalloc, tmp_path: Path
) -> None:
    example = yaml.safe_load_all((EXAMPLES / "gpu.yaml").read_text())
    template, example_pod = sorted(example, key=lambda d: d["kind"] == "Pod")
    other = {**example_pod, "metadata": {"name": "other"}}
    two = write(tmp_path, "two.yaml", template, example_pod, other)
    ran = topoalloc("allocate", "--device", DGX1, "--pod", two, "--claim", two)
    assert ran.code == 2 and ran.clean_error
    assert ran.stderr.strip() == (
        f"error: pod file ({two}): holds 3 YAML documents: expected one Pod, found 2 (documents 2, 3)"
    )
    none = write(tmp_path, "none.yaml", template, template)
    ran = topoalloc("allocate", "--device", DGX1, "--pod", none, "--claim", none)
    assert ran.code == 2 and ran.clean_error
    assert "holds 2 YAML documents (ResourceClaimTemplate, ResourceClaimTemplate) and no Pod" in ran.stderr
