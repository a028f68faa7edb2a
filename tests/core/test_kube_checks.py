"""kube-scheduler's modelled checks as a cached column (`ClusterState.kube_codes`): always the
per-node verdict (`kube_refusal`), also after pods come and go, nodes are relabelled, added and
removed between questions, for every request shape at once."""

from __future__ import annotations

import random

from allocator.core.cluster import kube_checks
from allocator.core.cluster.state import ClusterState
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from tests.core.pods import pod
from tests.core.test_cluster import node


def _requests() -> list[PodRequest]:
    shapes = []
    for cpu in ("1", "30", "70"):
        for selector in ({}, {"zone": "a"}, {"zone": "b"}):
            p = pod({"cpu": cpu, "memory": "8Gi"})
            if selector:
                p["spec"]["nodeSelector"] = selector
            shapes.append(pod_request(p))
    pinned = pod({"cpu": "1"})
    pinned["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n3"]}]}
                ]
            }
        }
    }
    shapes.append(pod_request(pinned))
    shapes.append(pod_request(pod({"memory": "300Gi"})))
    return shapes


def _expected(c: ClusterState, req: PodRequest, names: list[str]) -> list[str | None]:
    out = []
    for name in names:
        state = c.nodes.get(name)
        out.append("unknown" if state is None else kube_checks.kube_refusal(state, req))
    return out


def _got(c: ClusterState, req: PodRequest, names: list[str]) -> list[str | None]:
    codes = c.kube_codes(req, names).tolist()
    return ["unknown" if code == kube_checks.UNKNOWN else kube_checks.MESSAGES[code] for code in codes]


def test_the_column_is_always_the_per_node_verdict() -> None:
    rng = random.Random(7)
    c = ClusterState()
    names = [f"n{i}" for i in range(12)]
    for name in names:
        c.upsert_node(node(name, {"zone": rng.choice("ab")}, cpu="64", pods=str(rng.choice((2, 110)))))
    asked = [*names, "ghost"]
    reqs = _requests()
    seen: set[str | None] = set()
    for step in range(300):
        req = rng.choice(reqs)
        want = _expected(c, req, asked)
        assert _got(c, req, asked) == want, step
        seen.update(want)
        change = rng.random()
        name = rng.choice(names)
        if change < 0.5:
            c.assign(f"ns/p{step}", name, None, rng.choice((1000, 20000)), 1 << 30)
        elif change < 0.7 and c.pod_node:
            c.unassign(rng.choice(sorted(c.pod_node)))
        elif change < 0.85:
            c.upsert_node(node(name, {"zone": rng.choice("ab")}, cpu=rng.choice(("16", "64"))))
        elif change < 0.92:
            c.remove_node(name)
        else:
            c.upsert_node(node(name, {"zone": "a"}))
    # every verdict came up, so the column was checked against each
    assert {
        None,
        "unknown",
        kube_checks.AFFINITY,
        "Too many pods",
        "Insufficient cpu",
        "Insufficient memory",
    } <= seen
