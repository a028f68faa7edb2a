"""A small cluster of DGX H100 nodes (8 GPUs, one NVSwitch domain each) with pods on chosen GPUs,
and their facts as the defragmentation planner reads them."""

from __future__ import annotations

from allocator.core.cluster.state import ClusterState
from allocator.core.defrag.inputs import PodFacts, Waiter
from allocator.core.request.parse import pod_request
from allocator.core.request.pod_request import PodRequest
from apis.annotations import DeviceAllocations
from tests.core.pods import gpus, pod
from tests.support.allocations import entry
from tests.support.machines import dgx_h100_device

WHOLE = {"koordinator.sh/gpu-core": 100, "koordinator.sh/gpu-memory-ratio": 100}
HOUR = 3600.0


def request(n: int, priority: int, name: str) -> PodRequest:
    namespace, _, short = name.rpartition("/")
    raw = pod(gpus(n), name=short, namespace=namespace or "default")
    raw["spec"]["priority"] = priority
    return pod_request(raw)


class World:
    def __init__(self, nodes: int) -> None:
        self.cluster = ClusterState()
        for i in range(nodes):
            self.cluster.set_device(dgx_h100_device(f"n{i}"))
        self.facts: list[PodFacts] = []

    def run(
        self,
        key: str,
        node: str,
        minors: list[int],
        *,
        priority: int = 0,
        owner: str = "ReplicaSet",
        started: float = 0.0,
        gang: str = "",
        protected: bool = False,
    ) -> PodFacts:
        key = key if "/" in key else f"default/{key}"
        self.cluster.assign(key, node, DeviceAllocations({"gpu": [entry(m, WHOLE) for m in minors]}))
        facts = PodFacts(
            key, node, priority, request(len(minors), priority, key), len(minors), owner,
            f"rs/{key.split('/')[1].split('-')[0]}", gang, protected, started, f"uid-{key}",
        )  # fmt: skip
        self.facts.append(facts)
        return facts


def gang(name: str, members: int, each: int, priority: int = 100) -> Waiter:
    reqs = tuple(request(each, priority, f"train/{name}-{i}") for i in range(members))
    return Waiter(f"gang train/{name}", reqs, priority)
