"""One GPU count per node (apis.resources.node_gpus): the vendor's whole cards and the agent's
`koordinator.sh/gpu` in hundreds name the same GPUs; a pod's share of one GPU takes one."""

from __future__ import annotations

from typing import Any

import pytest

from apis.resources import node_gpus, pod_gpus


@pytest.mark.parametrize(
    ("allocatable", "gpus"),
    [
        ({"nvidia.com/gpu": "8", "koordinator.sh/gpu": "800"}, 8),  # kubelet's plugin and the agent
        ({"koordinator.sh/gpu": "800", "koordinator.sh/gpu-core": "800"}, 8),
        ({"nvidia.com/gpu": 4}, 4),  # a parsed Node holds whole numbers
        ({"nvidia.com/gpu": "7", "koordinator.sh/gpu": "800"}, 8),  # one GPU not announced by kubelet yet
        ({"amd.com/gpu": "2", "koordinator.sh/gpu": "250"}, 2),
        ({"cpu": "64", "nvidia.com/gpu": "not-a-number"}, 0),
        ({}, 0),
    ],
)
def test_a_nodes_gpus_are_counted_once(allocatable: dict[str, Any], gpus: int) -> None:
    assert node_gpus(allocatable) == gpus


@pytest.mark.parametrize(
    ("requests", "gpus"),
    [
        ({"nvidia.com/gpu": "2"}, 2),
        ({"koordinator.sh/gpu": "150"}, 2),
        ({"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}, 1),
        ({"koordinator.sh/gpu.shared": "2", "koordinator.sh/gpu-memory-ratio": "100"}, 2),
        ({"cpu": "4"}, 0),
    ],
)
def test_a_pods_gpus_count_a_share_as_one(requests: dict[str, Any], gpus: int) -> None:
    assert pod_gpus(requests) == gpus
