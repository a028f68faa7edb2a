"""Hand-computed fragmentation (FGD §3) on one node: GPUs free [100, 30, 0, 100] %, 8 cores free."""

import pytest

from allocator.core.scoring.fragmentation import (
    MAX_GROWTH_SCORE,
    best_placement,
    growth_score,
    node_fragment,
    placement_options,
    score_node,
    whole_gpu_pick,
)
from allocator.core.scoring.workload_mix import TaskShape, WorkloadMix

CPU_ONLY = TaskShape(1_000)
HALF = TaskShape(4_000, 50, 1)
WHOLE = TaskShape(2_000, 100, 1)
TWO = TaskShape(16_000, 100, 2)
MIX = WorkloadMix((CPU_ONLY, HALF, WHOLE, TWO), (0.2, 0.3, 0.3, 0.2))
NODE = [100, 30, 0, 100]


def test_fragment_of_one_node_for_one_shape_each() -> None:
    one = {s: node_fragment(NODE, 8_000, WorkloadMix((s,), (1.0,)).compiled_for("M")) for s in MIX.shapes}
    assert one[CPU_ONLY] == 230  # no GPU wanted: all idle GPU is fragment
    assert one[HALF] == 30  # fits; only GPUs with < 50% free count: 30 + 0
    assert one[WHOLE] == 30  # fits on a free GPU; the 30% GPU is fragment
    assert one[TWO] == 230  # two free GPUs, but 16 cores > 8 free: CPU starves it


def test_node_fragment_is_the_mix_expectation() -> None:
    assert node_fragment(NODE, 8_000, MIX.compiled_for("M")) == pytest.approx(
        0.2 * 230 + 0.3 * 30 + 0.3 * 30 + 0.2 * 230
    )


def test_a_shape_that_rejects_the_model_sees_all_idle_gpu_as_fragment() -> None:
    only_g2 = WorkloadMix((TaskShape(4_000, 50, 1, ("G2",)),), (1.0,))
    assert node_fragment(NODE, 8_000, only_g2.compiled_for("T4")) == 230
    assert node_fragment(NODE, 8_000, only_g2.compiled_for("G2")) == 30


def test_a_node_without_idle_gpu_has_no_fragment() -> None:
    assert node_fragment([0, 0], 0, MIX.compiled_for("M")) == 0


def test_sharing_task_is_tried_on_each_distinct_gpu_and_the_best_growth_wins() -> None:
    task = TaskShape(1_000, 20, 1)
    options = {o.gpus: o.growth for o in placement_options(NODE, 8_000, task, MIX.compiled_for("M"))}
    # before 110; on GPU 1 -> [100,10,0,100], 7 cores: 0.2*210 + 0.3*10 + 0.3*10 + 0.2*210 = 90
    # on GPU 0 -> [80,30,0,100]: 0.2*210 + 0.3*30 + 0.3*110 + 0.2*210 = 126; GPU 3 equals GPU 0
    assert options == pytest.approx({(0,): 16.0, (1,): -20.0})
    assert best_placement(NODE, 8_000, task, MIX.compiled_for("M")).gpus == (1,)


def test_whole_gpu_tasks_take_the_lowest_free_gpus_and_cpu_only_tasks_change_cpu_only() -> None:
    assert whole_gpu_pick(NODE, 2) == (0, 3)
    assert whole_gpu_pick(NODE, 3) is None
    (whole,) = placement_options(NODE, 8_000, WHOLE, MIX.compiled_for("M"))
    assert whole.gpus == (0,)
    (cpu,) = placement_options(NODE, 8_000, TaskShape(5_000), MIX.compiled_for("M"))
    # 3 cores left: HALF (4 cores) no longer fits, its 0.3 share turns all 230 into fragment
    assert cpu.gpus == () and cpu.growth == pytest.approx(0.3 * (230 - 30))


def test_growth_score_is_fgd_sigmoid_scale() -> None:
    assert growth_score(0) == 50
    assert growth_score(-100) == 73  # one GPU less fragment: ⌊100·σ(1)⌋
    assert growth_score(100) == 26
    assert growth_score(1e9) == 0
    assert growth_score(-1e9) == MAX_GROWTH_SCORE


def test_score_node_prefers_less_growth() -> None:
    task = TaskShape(1_000, 20, 1)
    scored = score_node(NODE, 8_000, "M", task, MIX)
    assert scored is not None and scored.gpus == (1,) and scored.score == growth_score(-20.0)
    assert score_node(NODE, 8_000, "M", TaskShape(1_000, 100, 3), MIX) is None
    cpu = score_node(NODE, 8_000, "M", TaskShape(5_000), MIX)
    assert cpu is not None and cpu.gpus == () and cpu.score == growth_score(0.3 * 200)
