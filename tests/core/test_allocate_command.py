"""`topoalloc allocate`: outputs and exit codes, through click's runner and a real process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from apis import keys
from tests.core.pods import gpus, pod
from tests.support.machines import koordinator_example_device
from topoalloc.commands.allocate import allocate

DATA = Path(__file__).parent / "data"


def whole(minor: int) -> str:
    return json.dumps(
        {
            "minor": minor,
            "resources": {
                "koordinator.sh/gpu-core": "100",
                "koordinator.sh/gpu-memory": "81559Mi",
                "koordinator.sh/gpu-memory-ratio": "100",
            },
        }
    )


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    device = tmp_path / "device.json"
    device.write_text(json.dumps(koordinator_example_device()))
    example = pod(
        {"nvidia.com/gpu": "4", "koordinator.sh/rdma": "1"},
        name="trainer",
        annotations={
            keys.DEVICE_ALLOCATE_HINT: '{"rdma":{"vfSelector":{"matchLabels":{"type":"general"}}}}',
            keys.DEVICE_JOINT_ALLOCATE: '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}',
            keys.GPU_PARTITION_SPEC: '{"allocatePolicy":"Restricted","ringBusBandwidth":"200Gi"}',
        },
    )
    pod_file = tmp_path / "pod.yaml"
    pod_file.write_text(yaml.safe_dump(example))
    other = pod(gpus(2), name="other", node="gpu-node-01")
    vf = json.dumps(
        {
            "minor": 0,
            "resources": {"koordinator.sh/rdma": "1"},
            "extension": {"vfs": [{"minor": -1, "busID": "0000:1a:00.2"}]},
        }
    )
    other["metadata"]["annotations"] = {
        keys.DEVICE_ALLOCATED: f'{{"gpu":[{whole(0)},{whole(1)}],"rdma":[{vf}]}}'
    }
    assigned = tmp_path / "assigned.yaml"
    assigned.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [other]}))
    return {"device": device, "pod": pod_file, "assigned": assigned, "dir": tmp_path}


def invoke(*args: str | Path):
    return CliRunner().invoke(allocate, [str(a) for a in args])


def test_worked_example_through_the_cli(files: dict[str, Path]) -> None:
    result = invoke("--device", files["device"], "--pod", files["pod"], "--assigned", files["assigned"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (DATA / "koord-example-allocated.json").read_text().strip()
    assert result.stderr == ""


def test_explain_goes_to_stderr(files: dict[str, Path]) -> None:
    result = invoke(
        "--device", files["device"], "--pod", files["pod"], "--assigned", files["assigned"], "--explain"
    )
    assert result.exit_code == 0
    assert json.loads(result.stdout)["gpu"][0]["minor"] == 4
    assert "gpu 0: free gpu-core=0" in result.stderr
    assert "rdma 1: free rdma=100, 4 free VFs" in result.stderr
    assert "choice: GPUs 4, 5, 6, 7 from the partition table" in result.stderr


def test_explain_shows_the_gpu_sets_and_their_objective_on_a_dgx1(tmp_path: Path) -> None:
    """On the DGX-1 fixture (NVLink counts differ between pairs) the candidate sets and the values
    that decided are listed, best first."""
    device = Path(__file__).resolve().parents[2] / "hw-fixtures" / "dgx1-v100" / "expected-device.yaml"
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump(pod(gpus(2))))
    result = invoke("--device", device, "--pod", two, "--explain")
    assert result.exit_code == 0, result.output
    assert [g["minor"] for g in json.loads(result.stdout)["gpu"]] == [0, 3]
    lines = [line for line in result.stderr.splitlines() if line.startswith("choice:")]
    assert lines[0] == "choice: GPU sets by interconnect (every set compared), best first:"
    assert lines[1].startswith("choice:   GPUs 0, 3: bottleneck 50 GB/s NODE")
    assert any(line.startswith("choice:   GPUs 2, 3: bottleneck 50 GB/s NODE") and "leaves 50 GB/s SYS" in line
               for line in lines)  # fmt: skip
    assert lines[-1] == "choice: GPUs 0, 3 chosen by interconnect"


def test_rejection_exits_1_with_the_reason(files: dict[str, Path]) -> None:
    big = files["dir"] / "big.yaml"
    big.write_text(yaml.safe_dump(pod(gpus(8))))
    result = invoke("--device", files["device"], "--pod", big, "--assigned", files["assigned"])
    assert result.exit_code == 1
    assert result.stdout.strip() == "need a free 8-GPU partition; none is free"


def test_bad_annotation_is_a_reason_not_a_crash(files: dict[str, Path]) -> None:
    bad = files["dir"] / "bad.yaml"
    bad.write_text(yaml.safe_dump(pod(gpus(1), annotations={keys.DEVICE_ALLOCATE_HINT: "{oops"})))
    result = invoke("--device", files["device"], "--pod", bad)
    # A pod Koordinator would refuse is bad input (exit 2, on stderr), not a node without room.
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(
        f"error: pod file ({bad}): invalid scheduling.koordinator.sh/device-allocate-hint annotation"
    )


def test_device_scoring_and_node_labels(files: dict[str, Path]) -> None:
    dev = koordinator_example_device()
    dev["metadata"]["annotations"] = {}
    device = files["dir"] / "plain.yaml"
    device.write_text(yaml.safe_dump(dev))
    node = files["dir"] / "node.yaml"
    node.write_text(yaml.safe_dump({"metadata": {"name": "gpu-node-01", "labels": {}}}))
    shared = files["dir"] / "shared.yaml"
    shared.write_text(yaml.safe_dump(pod({"koordinator.sh/gpu": "20"})))
    used = pod({}, name="half", node="gpu-node-01")
    used["metadata"]["annotations"] = {
        keys.DEVICE_ALLOCATED: '{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"50",'
        '"koordinator.sh/gpu-memory-ratio":"50","koordinator.sh/gpu-memory":"40779Mi"}}]}'
    }
    assigned = files["dir"] / "half.yaml"
    assigned.write_text(yaml.safe_dump_all([used]))
    common = ["--device", device, "--pod", shared, "--node", node, "--assigned", assigned]
    most = invoke(*common, "--device-scoring", "MostAllocated")
    least = invoke(*common, "--device-scoring", "LeastAllocated")
    assert (most.exit_code, least.exit_code) == (0, 0)
    assert json.loads(most.stdout)["gpu"][0]["minor"] == 1
    assert json.loads(least.stdout)["gpu"][0]["minor"] == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read: No such file"),
        ("{: bad yaml", "not valid YAML"),
        ("[1, 2]", "expected an object, not a list"),
        ('{"spec": {"devices": [{"type": "gpu", "minor": "x"}]}}', "spec.devices[0].minor"),
    ],
)
def test_unreadable_input_exits_2(files: dict[str, Path], content: str | None, message: str) -> None:
    device = files["dir"] / "broken.yaml"
    if content is not None:
        device.write_text(content)
    result = invoke("--device", device, "--pod", files["pod"])
    assert result.exit_code == 2
    assert message in result.stderr and result.stdout == ""


def test_unreadable_assigned_list_exits_2(files: dict[str, Path]) -> None:
    assigned = files["dir"] / "assigned-bad.yaml"
    assigned.write_text('"just a string"')
    result = invoke("--device", files["device"], "--pod", files["pod"], "--assigned", assigned)
    assert result.exit_code == 2 and "expected Pods or a List of Pods" in result.stderr


def _topoalloc() -> list[str]:
    exe = Path(sys.executable).parent / "topoalloc"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "topoalloc"]


def test_exit_codes_of_the_real_command(files: dict[str, Path]) -> None:
    base = [*_topoalloc(), "allocate", "--device", str(files["device"])]
    fit = subprocess.run([*base, "--pod", str(files["pod"])], capture_output=True, text=True, timeout=60)
    assert fit.returncode == 0, fit.stderr
    assert json.loads(fit.stdout)["gpu"][0]["minor"] == 0
    big = files["dir"] / "nine.yaml"
    big.write_text(yaml.safe_dump(pod(gpus(9))))
    rejected = subprocess.run([*base, "--pod", str(big)], capture_output=True, text=True, timeout=60)
    assert rejected.returncode == 1
    # more GPUs than the node has: said as that, not as the partition sizes (issue 31)
    assert rejected.stdout.strip() == "need 9 GPUs; the node has 8 GPUs"
    missing = subprocess.run(
        [*base, "--pod", str(files["dir"] / "nope.yaml")], capture_output=True, text=True, timeout=60
    )
    assert (
        missing.returncode == 2 and "error: pod file (" in missing.stderr and "cannot read" in missing.stderr
    )
