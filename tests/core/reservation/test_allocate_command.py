"""`topoalloc allocate --reservation`: rooms on the node, the owner takes from its room, others
do not, and --explain says which room was used or why none was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from apis import keys
from apis.reservation_pod import RESERVATION_ALLOCATED
from tests.core.pods import gpus, pod
from tests.support.machines import machine_device
from topoalloc.commands.allocate import allocate


def reservation(name: str, n: int, owner: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {
            "template": {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": str(n)}}}]}},
            "owners": [{"labelSelector": {"matchLabels": {"app": owner}}}],
            **spec,
        },
    }


@pytest.fixture
def write(tmp_path: Path) -> Any:
    def put(name: str, obj: Any) -> str:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(obj))
        return str(path)

    return put


def run(*args: str) -> Any:
    return CliRunner().invoke(allocate, list(args))


def test_the_owner_takes_its_room_and_others_see_it_taken(write: Any) -> None:
    device = write("device.yaml", machine_device("dgx-h100", "n1"))
    room = write("r.yaml", reservation("train", 4, "train"))
    owner = pod(gpus(4), name="owner", labels={"app": "train"})
    got = run("--device", device, "--pod", write("owner.yaml", owner), "--reservation", room, "-o", "json")
    assert got.exit_code == 0, got.output
    data = json.loads(got.output)
    assert data["reservation"] == "train"
    assert json.loads(data["annotations"][RESERVATION_ALLOCATED]) == {"name": "train", "uid": "uid-train"}
    mine = sorted(g["minor"] for g in data["allocation"]["gpu"])
    stranger = run(
        "--device", device, "--pod", write("s.yaml", pod(gpus(8), name="s")), "--reservation", room
    )
    assert stranger.exit_code == 1
    other = run(
        "--device",
        device,
        "--pod",
        write("o.yaml", pod(gpus(4), name="o")),
        "--reservation",
        room,
        "-o",
        "json",
    )
    theirs = sorted(g["minor"] for g in json.loads(other.output)["allocation"]["gpu"])
    assert set(mine).isdisjoint(theirs) and len(theirs) == 4


def test_explain_says_why_no_room_was_used(write: Any) -> None:
    device = write("device.yaml", machine_device("dgx-h100", "n1"))
    rooms = [
        write("a.yaml", reservation("a", 2, "someone-else")),
        write("b.yaml", reservation("b", 2, "train", taints=[{"key": "k", "effect": "NoSchedule"}])),
    ]
    owner = write("p.yaml", pod(gpus(2), name="p", labels={"app": "train"}))
    got = CliRunner().invoke(
        allocate,
        [
            "--device",
            device,
            "--pod",
            owner,
            "--explain",
            "--reservation",
            rooms[0],
            "--reservation",
            rooms[1],
        ],
    )
    assert got.exit_code == 0
    err = got.output  # stdout and stderr together
    assert "reservation a: not used: the pod is not one of its owners" in err
    assert "reservation b: not used: its taint k:NoSchedule is not tolerated" in err
    assert "no reservation used" in err


def test_a_bad_reservation_file_is_bad_input(write: Any) -> None:
    device = write("device.yaml", machine_device("dgx-h100", "n1"))
    bad = reservation("bad", 1, "x", ttl="soon")
    got = run(
        "--device", device, "--pod", write("p.yaml", pod(gpus(1))), "--reservation", write("bad.yaml", bad)
    )
    assert got.exit_code == 2 and "spec.ttl" in got.output


def test_an_owner_already_bound_used_the_room(write: Any) -> None:
    device = write("device.yaml", machine_device("dgx-h100", "n1"))
    owner = pod(gpus(4), name="p", labels={"app": "train"})
    first = run("--device", device, "--pod", write("p.yaml", owner),
                "--reservation", write("r.yaml", reservation("once", 4, "train")), "-o", "json")  # fmt: skip
    devices = json.loads(first.output)["annotations"][keys.DEVICE_ALLOCATED]
    placed = reservation("once", 4, "train")  # as the API holds it once placed
    placed["metadata"]["annotations"] = {keys.DEVICE_ALLOCATED: devices}
    placed["status"] = {"phase": "Available", "nodeName": "n1"}
    bound = pod(gpus(4), name="p", labels={"app": "train"}, node="n1")
    bound["metadata"]["annotations"] = {
        keys.DEVICE_ALLOCATED: devices,
        RESERVATION_ALLOCATED: json.dumps({"name": "once"}),
    }
    second = pod(gpus(4), name="q", labels={"app": "train"})
    got = run("--device", device, "--pod", write("q.yaml", second), "--assigned",
              write("bound.yaml", {"kind": "List", "items": [bound]}),
              "--reservation", write("placed.yaml", placed), "--explain", "-o", "json")  # fmt: skip
    assert got.exit_code == 0, got.output
    assert "allocateOnce, and it has an owner already" in got.output
    taken = {g["minor"] for g in json.loads(devices)["gpu"]}
    assert taken.isdisjoint(g["minor"] for g in json.loads(got.stdout)["allocation"]["gpu"])


def test_claims_and_reservations_together_are_bad_input(write: Any) -> None:
    """One node is in one mode: claims on a DRA-mode node, rooms of device resources elsewhere."""
    device = write("device.yaml", machine_device("dgx-h100", "n1"))
    room = write("r.yaml", reservation("train", 4, "train"))
    claim = write("c.yaml", {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"})
    args = ["--device", device, "--pod", write("p.yaml", pod(gpus(1))), "--reservation", room]
    got = CliRunner().invoke(allocate, [*args, "--claim", claim])
    assert got.exit_code == 2
    assert "error: --claim and --reservation" in got.output and "give one" in got.output
