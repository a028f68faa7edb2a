"""`NodeTable.totals` (idle GPU per GPU model, what the fragmentation term's model pressure reads)
equals the sum over the nodes as pods come and go, nodes are relabelled, removed and re-added."""

from __future__ import annotations

import random

from allocator.core.cluster.state import ClusterState
from allocator.core.devices.allocate import Allocation
from allocator.core.node.gpu_features import GPU_IDLE_PCT, GPU_MODEL, gpu_model
from allocator.core.node.gpu_summary import GPUSummary
from allocator.core.request.parse import pod_request
from apis import keys
from tests.core.pods import gpus, pod
from tests.support.machines import dgx_h100_device, l40s_device


def _brute(cluster: ClusterState) -> dict[str, int]:
    out: dict[str, int] = {}
    for state in cluster.nodes.values():
        out[gpu_model(state)] = out.get(gpu_model(state), 0) + sum(GPUSummary.of(state).free_pct)
    return out


def _add(cluster: ClusterState, name: str, rng: random.Random) -> None:
    labels = {keys.GPU_MODEL: "relabelled"} if rng.random() < 0.2 else {}
    node = {
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": "64", "memory": "1Ti"}},
    }
    cluster.upsert_node(node)
    cluster.set_device(dgx_h100_device(name) if rng.random() < 0.5 else l40s_device(name))


def test_totals_follow_every_change() -> None:
    rng = random.Random(11)
    cluster = ClusterState()
    names = [f"n{i}" for i in range(6)]
    for name in names:
        _add(cluster, name, rng)
    placed: list[str] = []
    requests = [pod_request(pod(gpus(n, cpu="1"))) for n in (1, 2, 4)]
    for step in range(120):
        action = rng.random()
        if action < 0.5:
            req, node = rng.choice(requests), rng.choice(names)
            if node in cluster.nodes and isinstance(got := cluster.allocate(req, node), Allocation):
                cluster.assign(f"ns/p{step}", node, got.devices, 1000, 2**30)
                placed.append(f"ns/p{step}")
        elif action < 0.7 and placed:
            cluster.unassign(placed.pop(rng.randrange(len(placed))))
        elif action < 0.85:
            name = rng.choice(names)
            if name in cluster.nodes:
                cluster.remove_node(name)
                placed = [k for k in placed if cluster.pod_node.get(k) is not None]
            else:
                _add(cluster, name, rng)
        else:
            _add(cluster, rng.choice(names), rng)  # a relabel or a Device update of a live node
        if rng.random() < 0.6:  # read only now and then: changes accumulate between reads
            assert cluster.table.totals(GPU_MODEL, GPU_IDLE_PCT) == _brute(cluster)
    assert cluster.table.totals(GPU_MODEL, GPU_IDLE_PCT) == _brute(cluster)
