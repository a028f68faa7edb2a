"""The replay with defragmentation on a hand-built stream: two 8-GPU nodes each left with one 2-GPU
pod, an 8-GPU gang waits; the core's planner moves one 2-GPU pod (never a gang member), the gang
binds, no GPU is booked twice, and the counters add up. Then the CLI flag."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from allocator.core.defrag.migration import Limits
from simulator.cluster import RequestFactory, SimCluster, SimRequest
from simulator.defrag_replay import DefragReplay, DefragRun, DefragSimSettings
from simulator.engine import POLICIES
from simulator.gang_planner import Gang
from simulator.nodes import fixture_objects
from simulator.objects import pod_object
from simulator.runner import workload_setup
from topoalloc.cli import main

TICK = 60.0


def pod(factory: RequestFactory, name: str, gpus: int, gang: str = "") -> SimRequest:
    requests = {"cpu": "1", "memory": "1Gi"}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    return factory.request(pod_object(name, requests), gang=gang)


def replay(
    *, defrag: bool, small_in_gangs: bool = False, limits: Limits | None = None
) -> tuple[DefragRun, SimCluster]:
    factory = RequestFactory()
    cluster = SimCluster([fixture_objects("l40s-8x-pcie", "a"), fixture_objects("l40s-8x-pcie", "b")])
    policy = POLICIES["topoalloc"](workload_setup(cluster.size, 1), None)  # type: ignore[arg-type]

    def small(name: str) -> SimRequest | Gang:
        if small_in_gangs:  # a running gang's member: the planner may never move it
            return Gang(name, (pod(factory, name, 2, gang=name),))
        return pod(factory, name, 2)

    # Ticks 0-3: a 6-GPU and a 2-GPU pod fill each node; tick 4 both 6-GPU pods leave, so each node
    # has 6 GPUs free and no 8-GPU room; tick 5 the 8-GPU gang arrives and waits.
    stream = [pod(factory, "f1", 6), pod(factory, "f2", 6), small("s1"), small("s2"), pod(factory, "c0", 0)]
    stream += [Gang("g", (pod(factory, "g-0", 8, gang="g"),))]
    stream += [pod(factory, f"c{i}", 0) for i in range(1, 5)]
    lives = iter([4, 3] + [100] * (len(stream) - 2))
    settings = DefragSimSettings(
        tick_seconds=TICK, defrag=defrag, interval=TICK, min_wait=0, sample_every=TICK
    )
    if limits is not None:
        settings = replace(settings, limits=limits)
    run = DefragReplay(cluster, policy, settings).run(stream, lambda: next(lives), lambda: None)
    return run, cluster


def whole_gpus_used(cluster: SimCluster) -> int:
    return sum(sum(1 for pct in cluster.free_pct(i) if pct == 0) for i in range(cluster.size))


def test_without_defragmentation_the_gang_never_binds() -> None:
    run, _ = replay(defrag=False)
    assert run.never == [(8, 1)] and run.moves == 0 and run.gpu_hours_lost == 0
    assert run.waits == []
    assert [b for _, b in run.blocks][5:] == [6] * 5  # fragmented: 6 GPUs free on each node


def test_defragmentation_moves_one_small_pod_and_the_gang_binds() -> None:
    run, cluster = replay(defrag=True)
    pods = cluster.core.pod_node
    assert run.moves == 1 and run.given_up == 0 and run.held == 0
    assert run.waits == [(TICK, 8, 1)]  # arrived at tick 5, bound after the move at tick 6
    assert run.never == []
    moved = [k for k in pods if "~" in k]
    assert len(moved) == 1 and moved[0].split("~")[0] in ("sim/s1", "sim/s2")
    assert moved[0].split("~")[0] not in pods  # the old pod left its node
    others = {pods[k] for k in pods if k.startswith("sim/s")}
    assert len(others) == 1 and others != {pods["sim/g-0"]}  # both 2-GPU pods now share a node
    assert whole_gpus_used(cluster) == 2 + 2 + 8 and run.booked_twice == 0
    assert all(min(cluster.free_pct(i)) >= 0 for i in range(cluster.size))
    # lost work: the moved pod's 2 GPUs x its age (started at tick 2 or 3, moved at tick 6)
    assert run.gpu_hours_lost in (pytest.approx(2 * 4 * TICK / 3600), pytest.approx(2 * 3 * TICK / 3600))
    assert run.hours == pytest.approx(10 * TICK / 3600) and run.moves_per_hour == pytest.approx(1 / run.hours)
    assert run.blocks[6][1] == 4  # one node went to the gang at once; the other holds both 2-GPU pods


def test_running_gang_members_are_never_moved() -> None:
    run, cluster = replay(defrag=True, small_in_gangs=True)
    assert run.moves == 0 and run.never == [(8, 1)]
    assert not any("~" in k for k in cluster.core.pod_node)


def test_the_controller_limits_hold_moves_back() -> None:
    run, _ = replay(defrag=True, limits=Limits(max_migrating=0))
    assert run.moves == 0 and run.held > 0 and run.never == [(8, 1)]


WORKLOAD = """
jobs:
  - name: inference
    replicas: 6
    requests: {cpu: "2", memory: 8Gi, nvidia.com/gpu: "2"}
  - name: train
    replicas: 1
    gang: true
    at: 1.0
    requests: {cpu: "8", memory: 64Gi, nvidia.com/gpu: "8"}
"""


def test_simulate_defrag_prints_the_table_and_writes_the_plot(tmp_path: Path) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    out = tmp_path / "r.json"
    args = ["simulate", "--workload", str(workload), "--nodes", "hw-fixtures:l40s-8x-pcie=2", "--defrag",
            "--days", "2", "--mean-hours", "6", "--seeds", "1,2", "--no-progress", "--json", str(out),
            "--plots", str(tmp_path / "plots")]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("defragmentation: w, policy topoalloc, 2 days") for line in lines)
    assert [line.split()[:2] for line in lines if line.split()[:1] in (["all"], ["8-GPU"])] == [
        ["all", "off"], ["all", "on"], ["8-GPU", "off"], ["8-GPU", "on"],
    ]  # fmt: skip
    assert (tmp_path / "plots" / "w" / "topoalloc" / "defrag-largest-free-block.png").stat().st_size > 0
    report = json.loads(out.read_text())
    runs = report["policies"]["topoalloc"]
    assert len(runs["without"]) == len(runs["with"]) == 2
    assert all(r["moves"] == 0 for r in runs["without"])
    assert all(r["booked_twice"] == 0 for r in runs["with"])
    # every gang arrived is placed or still waiting: 2 days, one train gang a day
    for r in runs["without"] + runs["with"]:
        assert sum(1 for _, g, _ in r["waits"] if g == 8) + len(r["never"]) == 2


def test_defrag_needs_a_workload() -> None:
    result = CliRunner().invoke(main, ["simulate", "--paper", "default", "--defrag"])
    assert result.exit_code != 0 and "--defrag replays a --workload FILE" in result.output
