"""`-o json|yaml` where people script (issue 18): allocate, inspect, agent --print; the data
matches what the human form says."""

from __future__ import annotations

import json
from collections.abc import Callable

import yaml

from tests.cli.conftest import DGX, DGX_DEVICE, REPO, Ran

Run = Callable[..., Ran]
POD = REPO / "examples" / "pod.yaml"
L40S = REPO / "hw-fixtures" / "l40s-8x-pcie" / "expected-device.yaml"


def test_allocate_output_formats(topoalloc: Run) -> None:
    text = topoalloc("allocate", "--device", DGX_DEVICE, "--pod", POD)
    as_json = topoalloc("allocate", "--device", DGX_DEVICE, "--pod", POD, "-o", "json")
    as_yaml = topoalloc("allocate", "--device", DGX_DEVICE, "--pod", POD, "--output", "yaml")
    assert text.code == as_json.code == as_yaml.code == 0
    data = json.loads(as_json.stdout)
    assert data == yaml.safe_load(as_yaml.stdout)
    assert data["fits"] is True and data["node"] == "dgx-h100"
    assert data["annotations"]["scheduling.koordinator.sh/device-allocated"] == text.stdout.strip()
    assert [g["minor"] for g in data["allocation"]["gpu"]] == [0, 1]
    rejected = topoalloc("allocate", "--device", L40S, "--pod", POD, "-o", "json")
    assert rejected.code == 1
    reply = json.loads(rejected.stdout)
    assert reply["fits"] is False and reply["reason"] and reply["code"]


def test_inspect_output_formats(topoalloc: Run) -> None:
    matrix = topoalloc("inspect", DGX_DEVICE)
    data = json.loads(topoalloc("inspect", DGX_DEVICE, "-o", "json").stdout)
    assert data == yaml.safe_load(topoalloc("inspect", DGX_DEVICE, "-o", "yaml").stdout)
    names = [d["name"] for d in data["devices"]]
    assert names[:8] == [f"GPU{i}" for i in range(8)]
    header = matrix.stdout.splitlines()[0].split()
    assert header[: len(names)] == names
    gpu0_row = matrix.stdout.splitlines()[1].split()
    assert gpu0_row[2] == data["matrix"]["GPU0"]["GPU1"]  # the same relation in both forms


def test_agent_print_as_json(topoalloc: Run) -> None:
    docs = list(yaml.safe_load_all(topoalloc("agent", "--once", "--print", "--fixture", DGX).stdout))
    listed = json.loads(topoalloc("agent", "--once", "--print", "--fixture", DGX, "-o", "json").stdout)
    assert listed["kind"] == "List" and len(listed["items"]) == len(docs) == 2
    for item, doc in zip(listed["items"], docs, strict=True):  # conditions carry the time of each run
        assert item["kind"] == doc["kind"] and item["metadata"] == doc["metadata"]
    ids = [
        [(d["type"], d["minor"], d.get("id")) for d in x["spec"]["devices"]]
        for x in (listed["items"][0], docs[0])
    ]
    assert ids[0] == ids[1] and len(ids[0]) == 20
