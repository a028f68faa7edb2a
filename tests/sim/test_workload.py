"""YAML workloads of jobs and gangs on hw-fixture nodes, gangs all-or-nothing, and the demo."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from allocator.core.node.gpu_summary import GPUSummary
from apis import keys
from simulator.cluster import SimCluster
from simulator.engine import POLICIES
from simulator.gang_planner import Gang
from simulator.nodes import fixture_objects, nodes_from_spec
from simulator.openb import TraceError
from simulator.runner import workload_setup
from simulator.workload import arrivals, load_workload, parse_workload, trace_pods
from topoalloc.cli import main

# 8 L40S + 4 A100: 12 GPUs, one node with 8
NODES = "hw-fixtures:l40s-8x-pcie=1,a100-pcie-4x-no-rdma=1"
WORKLOAD = {
    "jobs": [
        {
            "name": "pair",
            "replicas": 2,
            "gang": True,
            "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"},
        },
        {
            "name": "huge",
            "replicas": 2,
            "gang": True,
            "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"},
        },
        {
            "name": "share",
            "replicas": 3,
            "requests": {
                "cpu": "2",
                "memory": "8Gi",
                "koordinator.sh/gpu-core": "40",
                "koordinator.sh/gpu-memory-ratio": "40",
            },
        },
    ]
}


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_gangs_are_placed_whole_or_not_at_all(tmp_path: Path) -> None:
    workload = load_workload(write(tmp_path, WORKLOAD))
    objects = nodes_from_spec(NODES)
    cluster = SimCluster(objects, tie_seed=3)
    stream = arrivals(workload, cluster.capacity_pct, seed=3)
    assert [type(a).__name__ for a in stream] == ["Gang", "Gang", "SimRequest", "SimRequest", "SimRequest"]
    pair, huge = stream[0], stream[1]
    assert isinstance(pair, Gang) and isinstance(huge, Gang)
    assert pair.members[0].pod.gang is not None and pair.members[0].pod.gang.name == "pair"
    policy = POLICIES["topoalloc"](workload_setup(cluster.size, 3), None)
    policy.attach(cluster)
    assert cluster.place(pair.members, policy).placed
    # both on the L40S, one NUMA node each (the A100 board would split a member across sockets)
    assert [cluster.core.pod_node[m.key] for m in pair.members] == ["l40s-8x-pcie-00"] * 2
    before = [GPUSummary.of(s).free_pct for s in cluster.states]
    # 8 GPUs per member: the first fits nowhere now (0 + 4 free whole GPUs left)... and nothing stays held
    assert not cluster.place(huge.members, policy).placed
    assert all(m.key not in cluster.core.pod_node for m in huge.members)
    assert [GPUSummary.of(s).free_pct for s in cluster.states] == before


def test_a_failing_last_member_rolls_back_the_others() -> None:
    cluster = SimCluster(
        [fixture_objects("l40s-8x-pcie", "l0"), fixture_objects("a100-pcie-4x-no-rdma", "a0")]
    )
    workload = parse_workload(
        {
            "jobs": [
                {"name": "g", "replicas": 4, "gang": True, "requests": {"cpu": "1", "nvidia.com/gpu": "4"}}
            ]
        }
    )
    (gang,) = arrivals(workload, cluster.capacity_pct, seed=1)
    policy = POLICIES["bestfit"](workload_setup(cluster.size, 1), None)
    assert isinstance(gang, Gang)
    step = cluster.place(gang.members, policy)  # 12 GPUs: three 4-GPU members fit, the fourth not
    assert step.placed == () and step.allocated_pct == 0
    assert cluster.allocated_pct == 0 and not cluster.core.pod_node


def test_jobs_are_inserted_into_the_trace_at_their_position() -> None:
    workload = parse_workload(
        {
            "trace": {"pods": "sample", "fill": 1.0},
            "jobs": [
                {"name": "late", "replicas": 2, "at": 0.5, "requests": {"cpu": "1", "nvidia.com/gpu": "1"}}
            ],
        }
    )
    original = trace_pods(workload.trace)
    assert len(original) == 1000
    stream = arrivals(workload, 20_000, seed=4, original=original)  # a 200-GPU cluster
    keys_ = [a.key for a in stream if not isinstance(a, Gang)]
    at = keys_.index("sim/late-0")
    assert keys_[at + 1] == "sim/late-1" and abs(at - (len(stream) - 2) / 2) <= 1
    demand = sum(a.demand_pct for a in stream)
    assert 19_000 < demand <= 20_000  # fill 1.0 of 200 GPUs, the jobs' 2 GPUs included
    assert arrivals(workload, 20_000, seed=4, original=original) == stream
    assert [a.key for a in arrivals(workload, 20_000, seed=5, original=original)] != [a.key for a in stream]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"jobs": [{"replicas": 1, "requests": {"cpu": "1"}}]}, "needs a name"),
        ({"jobs": [{"name": "a", "requests": {"cpu": "1"}, "pod": {}}]}, "either requests or pod"),
        ({"jobs": [{"name": "a", "colour": "red", "requests": {"cpu": "1"}}]}, "unknown field"),
        ({"jobs": [{"name": "a", "at": 2, "requests": {"cpu": "1"}}]}, "within 0..1"),
        ({"jobs": []}, "no jobs and no trace"),
    ],
)
def test_bad_workloads_say_what_is_wrong(data: dict, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        parse_workload(data)


def test_simulate_a_workload_from_the_cli(tmp_path: Path) -> None:
    path = write(tmp_path, WORKLOAD)
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        main,
        ["simulate", "--workload", str(path), "--nodes", NODES, "--seeds", "1-2", "--policies", "bestfit,topoalloc",
         "--json", str(out), "--plots", str(tmp_path / "plots"), "--no-progress"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "cluster: 2 nodes" in result.output and "12 GPUs" in result.output
    rows: dict[str, str] = {}
    for line in result.output.splitlines():
        if line.startswith(("bestfit", "topoalloc")):
            rows.setdefault(line.split()[0], line)  # the first table: packing and gangs
    for row in rows.values():
        assert "1.0 / 2" in row  # one of the two gangs placed, every seed
    assert "8-GPU pods: " in result.output  # then the quality tables (or "too few to compare")
    data = json.loads(out.read_text())
    assert data["trace"] == "jobs" and set(data["policies"]) == {"bestfit", "topoalloc"}
    for png in ("unallocated.png", "fragmentation.png", "topology-vs-load.png"):
        assert (tmp_path / "plots" / "jobs" / png).read_bytes().startswith(b"\x89PNG")


def test_a_gang_member_carries_the_pod_group_label(tmp_path: Path) -> None:
    workload = load_workload(write(tmp_path, WORKLOAD))
    assert workload.jobs[0].pod["metadata"]["labels"][keys.POD_GROUP_LABEL] == "pair"
    assert keys.POD_GROUP_LABEL not in (workload.jobs[2].pod["metadata"].get("labels") or {})


def test_demo_prints_the_table_and_writes_its_plots(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["demo", "--out", str(tmp_path), "--seeds", "1", "--policies", "bestfit,topoalloc",
         "--nodes", "hw-fixtures:dgx-h100=2,l40s-8x-pcie=2,cpu-only=1", "--no-progress"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "idle GPU at 100% demand" in result.output and "gangs placed" in result.output
    assert any(line.startswith("topoalloc ") for line in result.output.splitlines())
    for png in ("unallocated.png", "fragmentation.png", "topology-vs-load.png"):
        data = (tmp_path / png).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000


def test_workload_setup_is_seeded() -> None:
    a, b = workload_setup(10, 7), workload_setup(10, 7)
    assert a.node_rank == b.node_rank and sorted(a.node_rank) == list(range(10))
    assert a.rng.random() == b.rng.random() != random.Random(8).random()


def test_a_job_of_dra_claims_is_placed_as_the_claims_controller_places_it() -> None:
    pair = {
        "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.topoalloc.io", "count": 2}}],
        "constraints": [{"matchAttribute": "topoalloc.io/nvlinkPartition2"}],
    }
    workload = parse_workload(
        {"jobs": [{"name": "dra", "replicas": 2, "requests": {"cpu": "1"}, "claims": [pair]}]}
    )
    cluster = SimCluster([fixture_objects("a100-pcie-4x-nvlink-pairs", "a0")])
    stream = arrivals(workload, cluster.capacity_pct, seed=1)
    first, second = stream
    assert not isinstance(first, Gang) and first.pod.gpu is not None and first.pod.gpu.count == 2
    assert first.pod.gpu.restricted_partition  # the claim's constraint, as the core reads it
    policy = POLICIES["topoalloc"](workload_setup(cluster.size, 1), None)
    policy.attach(cluster)
    for member in (first, second):
        assert cluster.place((member,), policy).placed
    # two NVLink pairs of the board, one per claim
    pods = cluster.core.nodes["a0"].pods
    assert sorted(
        sorted(a.minor for a in pods[k].allocations["gpu"]) for k in ("sim/dra-0", "sim/dra-1")
    ) == [[0, 1], [2, 3]]


@pytest.mark.parametrize(
    "claims, message",
    [
        (
            [{"requests": [{"name": "n", "exactly": {"deviceClassName": "rdma.topoalloc.io"}}]}],
            "claims of gpu.topoalloc.io only",
        ),
        (
            [{"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.topoalloc.io", "count": 0}}]}],
            "exactly.count",
        ),
        ({"requests": []}, "expected a list"),
    ],
)
def test_dra_claims_a_job_cannot_have(claims: object, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        parse_workload({"jobs": [{"name": "a", "requests": {"cpu": "1"}, "claims": claims}]})
