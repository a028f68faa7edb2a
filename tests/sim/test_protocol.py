import random

import pytest

from simulator.openb import OpenbNode, OpenbPod
from simulator.protocol import paper_setup, parse_seeds, target_workload, tune


def pod(name: str, gpus: int = 1, milli: int = 1000, cpu: int = 1000) -> OpenbPod:
    return OpenbPod(name, cpu, 0, gpus, milli if gpus else 0)


def test_tuning_up_stops_on_the_per_gpu_milli_so_an_eight_gpu_clone_overshoots() -> None:
    eight = pod("a", 8)
    # 8000 now, target 13000: the first draw tests 8000 + 1000 <= 13000 and adds 8000 (16000);
    # the second tests 16000 + 1000 > 13000 and stops
    out = tune([eight], [eight], 13_000, random.Random(1))
    assert [p.name for p in out] == ["a", "a-tuned-0"]


def test_tuning_up_appends_clones_after_the_original_order() -> None:
    pods = [pod("a", 1, 500), pod("b", 0), pod("c", 1, 1000)]
    out = tune(list(pods), pods, 4_000, random.Random(3))
    assert out[:3] == pods
    assert all(p.name.split("-tuned-")[0] in "abc" for p in out[3:])
    total = sum(p.gpu_demand_milli for p in out)
    assert 4_000 - 1000 < total <= 4_000


def test_tuning_down_deletes_random_pods_until_at_or_below_target() -> None:
    pods = [pod(f"p{i}", 2) for i in range(10)]  # 20000 milli
    out = tune(list(pods), pods, 13_000, random.Random(5))
    assert sum(p.gpu_demand_milli for p in out) == 12_000
    assert [p for p in pods if p in out] == out  # survivors keep their order


def test_paper_setup_shuffles_name_sorted_pods_by_seed_and_ranks_nodes() -> None:
    nodes = [OpenbNode(f"node-{i}", 8000, 1000, 1, "M") for i in range(5)]
    pods = [pod(f"pod-{i:02d}", 0) for i in range(20)] + [pod("pod-99", 1, 500)]
    one = paper_setup(nodes, list(reversed(pods)), seed=42)
    again = paper_setup(nodes, pods, seed=42)
    other = paper_setup(nodes, pods, seed=43)
    assert [p.name for p in one.pods] == [p.name for p in again.pods]  # input order does not matter
    assert [p.name for p in one.pods] != [p.name for p in other.pods]
    assert sorted(p.name for p in one.pods[:21]) == sorted(p.name for p in pods)
    assert all("-tuned-" in p.name for p in one.pods[21:])  # 500 milli -> tuned up to 6500
    assert sorted(one.node_rank) == list(range(5))


def test_target_workload_counts_shapes_of_the_original_trace() -> None:
    pods = (
        [pod(f"s{i}", 1, 500) for i in range(6)] + [pod(f"c{i}", 0) for i in range(3)] + [pod("w", 1, 1000)]
    )
    mix = target_workload(pods, coverage=0.9)
    assert [(s.gpu_pct, s.gpu_count) for s in mix.shapes] == [(50, 1), (0, 0)]
    assert mix.weights == pytest.approx((6 / 9, 3 / 9))


def test_parse_seeds() -> None:
    assert parse_seeds("42-45") == [42, 43, 44, 45]
    assert parse_seeds("1,3-4") == [1, 3, 4]
    for bad in ("", "5-3", "x"):
        with pytest.raises(ValueError):
            parse_seeds(bad)
