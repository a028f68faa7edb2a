"""Reservations replayed (simulator/reservations.py): a reserved gang takes exactly its rooms when it
arrives and waits less than without them; the room idles GPUs until then; the CLI reports both."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from simulator.cluster import RequestFactory, SimCluster
from simulator.engine import POLICIES
from simulator.gang_planner import Gang
from simulator.nodes import fixture_objects
from simulator.objects import pod_object
from simulator.reservations import replay_reserved
from simulator.runner import workload_setup
from topoalloc.commands.simulate import simulate

FACTORY = RequestFactory()


def pod(name: str, gpus: int) -> object:
    return FACTORY.request(pod_object(name, {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}))


def gang(name: str, members: int, gpus: int) -> Gang:
    reqs = tuple(
        FACTORY.request(pod_object(f"{name}-{i}", {"nvidia.com/gpu": str(gpus)}), gang=name)
        for i in range(members)
    )
    return Gang(name, reqs)


def stream() -> list[object]:
    # Fillers take the node one GPU at a time (each lives 4 ticks); "train" needs all 8 GPUs at
    # tick 6; cpu-only pods after it only let time pass.
    tail = [FACTORY.request(pod_object(f"t{i}-0", {"cpu": "1"})) for i in range(6)]
    return [pod(f"f{i}-0", 1) for i in range(6)] + [gang("train", 2, 4)] + tail


def run(leads: dict[str, int]) -> object:
    cluster = SimCluster([fixture_objects("l40s-8x-pcie", "n")])
    policy = POLICIES["bestfit"](workload_setup(cluster.size, 1), None)  # type: ignore[arg-type]
    return replay_reserved(cluster, stream(), policy, lambda: 4, leads), cluster  # type: ignore[arg-type]


def test_a_reserved_gang_waits_less_and_the_room_idles_meanwhile() -> None:
    without, _ = run({})
    assert without.waits["train"] > 0  # the fillers arrived first: it waits for them to leave
    with_room, cluster = run({"train": 7})
    assert with_room.waits["train"] == 0 and with_room.reserved["train"]
    assert with_room.idle_gpu_ticks["train"] == 8 * 6  # 8 GPUs held from tick 0 to tick 6
    assert not any(k.startswith("reservation:") for k in cluster.core.pod_node)  # rooms were taken


def test_a_reservation_too_late_is_no_help() -> None:
    late, _ = run({"train": 1})  # reserved at tick 5: the fillers already hold GPUs
    assert not late.reserved["train"]


def test_simulate_reports_reserved_jobs(tmp_path: Path) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(
        "jobs:\n"
        "  - {name: fill, replicas: 12, requests: {nvidia.com/gpu: '1'}}\n"
        "  - {name: train, replicas: 2, gang: true, at: 0, reserveAhead: 12, requests: {nvidia.com/gpu: '4'}}\n"
    )
    got = CliRunner().invoke(simulate, ["--workload", str(workload), "--nodes", "hw-fixtures:l40s-8x-pcie=1",
                                        "--seeds", "1", "--policies", "bestfit", "--no-plots", "--no-progress",
                                        "--lifetime", "5"])  # fmt: skip
    assert got.exit_code == 0, got.output
    assert "reserved jobs" in got.output and "GPU-hours idled" in got.output
    row = next(line for line in got.output.splitlines() if line.startswith("bestfit") and " train " in line)
    assert row.split()[1:3] == ["train", "12"]
