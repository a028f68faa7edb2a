"""`topoalloc defrag` against the fake API server (the real-cluster test is
tests/cluster/test_defrag.py): four nodes each run two 1-GPU pods of a ReplicaSet while an 8-GPU
pod waits. It shows each node's free GPUs and NVLink partitions, the plan (two pods off one node),
with --explain why each pod may move, and writes nothing; a budget allowing no disruption keeps
its pods; a bad kubeconfig, an unreachable or forbidding cluster are one line on stderr."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.cli.conftest import Ran
from tests.defrag.scenario import moves_made, running, world
from tests.support.fakeapi import FakeApiServer
from tests.support.kubeconfig import token_kubeconfig

Run = Callable[..., Ran]


def test_shows_fragmentation_and_the_plan_and_writes_nothing(
    topoalloc: Run, fake_api_thread: FakeApiServer, tmp_path: Path
) -> None:
    world(fake_api_thread)
    config = token_kubeconfig(tmp_path, fake_api_thread.url)
    ran = topoalloc("defrag", "--kubeconfig", config, "--min-wait", "0", "--explain", "-o", "json")
    assert ran.code == 0, ran.stderr
    data = json.loads(ran.stdout)
    assert data["fragmentation"]["largestFreeBlock"] == 6 and data["fragmentation"]["freeGPUs"] == 24
    assert [(n["node"], n["freeGPUs"]) for n in data["nodes"]] == [(f"gpu-{i}", 6) for i in range(4)]
    # A DGX H100's built-in partition table: no 8-GPU partition free while two GPUs are taken.
    assert all(n["partitionsFree"]["8"] == 0 for n in data["nodes"])
    moves = data["plan"]["moves"]
    assert len(moves) == 2 and len({m["from"] for m in moves}) == 1
    assert {m["unblocks"] for m in moves} == {"pod default/big"}
    assert data["plan"]["largestFreeBlock"] == {"before": 6, "after": 8}
    # What the controller would do were it on: one move per workload at a time (the default).
    assert [s["step"] for s in data["next"]] == ["reserve", "hold"]
    [waiter] = data["explain"]
    assert waiter["waiter"] == "pod default/big" and waiter["gpus"] == 8
    assert all(p["movable"] for p in waiter["pods"]) and len(waiter["pods"]) == 8
    assert sorted(p["pod"] for p in waiter["pods"] if "move" in p) == sorted(m["pod"] for m in moves)
    # Read-only: nothing but GETs (no Reservation, no eviction, no report).
    assert moves_made(fake_api_thread) == [] and len(running(fake_api_thread)) == 8
    assert {r.method for r in fake_api_thread.requests()} == {"GET"}

    text = topoalloc("defrag", "--kubeconfig", config, "--min-wait", "0", "--explain")
    assert text.code == 0
    assert "largest free block 6 GPUs" in text.stdout and "plan: 2 move(s)" in text.stdout
    assert "unblocks pod default/big with 2 move(s) (cheapest)" in text.stdout
    assert "default/web-1-0 on gpu-1 (1 GPU, priority 0): movable" in text.stdout


def test_a_budget_allowing_no_disruption_keeps_its_pods(
    topoalloc: Run, fake_api_thread: FakeApiServer, tmp_path: Path
) -> None:
    world(fake_api_thread)
    fake_api_thread.put(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "minAvailable": 8},
            "status": {"disruptionsAllowed": 0},
        }
    )
    config = token_kubeconfig(tmp_path, fake_api_thread.url)
    ran = topoalloc("defrag", "--kubeconfig", config, "--min-wait", "0", "--explain")
    assert ran.code == 0, ran.stderr
    assert "plan: 0 move(s)" in ran.stdout and "stuck: pod default/big: no pod may move" in ran.stdout
    assert "stays: a PodDisruptionBudget allows no disruption" in ran.stdout


def test_work_younger_than_min_wait_is_not_planned_for(
    topoalloc: Run, fake_api_thread: FakeApiServer, tmp_path: Path
) -> None:
    world(fake_api_thread)
    ran = topoalloc("defrag", "--kubeconfig", token_kubeconfig(tmp_path, fake_api_thread.url), "-o", "json")
    assert ran.code == 0 and json.loads(ran.stdout)["plan"]["moves"] == []


def test_a_forbidding_cluster_is_a_runtime_failure_in_one_line(
    topoalloc: Run, fake_api_thread: FakeApiServer, tmp_path: Path
) -> None:
    world(fake_api_thread)
    fake_api_thread.inject_fault(
        "GET", r"/poddisruptionbudgets", status=403, message="cannot list poddisruptionbudgets", times=None
    )
    ran = topoalloc("defrag", "--kubeconfig", token_kubeconfig(tmp_path, fake_api_thread.url))
    assert ran.code == 1 and ran.clean_error, ran
    assert "forbidden: cannot list poddisruptionbudgets" in ran.stderr


def test_an_unreachable_cluster_and_a_bad_kubeconfig(topoalloc: Run, tmp_path: Path) -> None:
    gone = topoalloc("defrag", "--kubeconfig", token_kubeconfig(tmp_path, "http://127.0.0.1:9"))
    assert gone.code == 1 and gone.clean_error and "unreachable" in gone.stderr, gone
    bad = tmp_path / "bad"
    bad.write_text("clusters: [not, a, config\n")
    ran = topoalloc("defrag", "--kubeconfig", bad)
    assert ran.code == 2 and ran.clean_error and "kubeconfig" in ran.stderr, ran
    missing = topoalloc("defrag", "--kubeconfig", tmp_path / "nope")
    assert missing.code == 2 and "not found" in missing.stderr
