"""The room rule (allocator/core/scoring/gang_room.py) on a real control plane: a pod that may run
on any GPU model keeps its NVLink credit only where its GPUs leave the gangs held to the node's GPU
model their room, the gangs learned from what the allocator placed.

Three DGX H100 and one 8x L40S, labelled with their GPU model. An H100-only gang of 2 x 8 GPUs
(a scheduler-plugins PodGroup, nodeSelector on the model) binds through the gang controller,
kube-scheduler and the extender, so the allocator learns 2 x 8 on H100; the gang then leaves.
An unconstrained 8-GPU pod takes a DGX (two whole ones stay: its NVLink costs nobody); the next one
would leave the model one whole DGX, fewer than the gang's two members, so it gets no NVLink credit
there and lands on the L40S; the gang, back, binds whole on the two DGX left.

The allocator is restarted around the module: what it learned from earlier modules' pods (its
workload mix) does not weigh in here, and the gang it learns here holds no room in later modules.
Its mix is then the gang's H100-only members, so once the DGX lose their NVLink credit the
fragmentation term prefers the L40S; without the rule the DGX's credit wins. The allocator's ranking
decides in either extender mode (docs/service.md, Round trips): one round trip passes its best node
alone, two give it weight 100."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from apis import keys
from tests.cluster.gang_sources import SCHEDULER_PLUGINS, SP_PODGROUPS
from tests.cluster.harness import ClusterEnv, gpu_minors, gpu_pod, held
from tests.support.controlplane import wait_until

POOL = {"topoalloc.test/pool": "gang-room"}
H100 = "H100-80GB-HBM3"  # the model the dgx-h100 fixture's agent labels its Node with
DGX = ("room-h1", "room-h2", "room-h3")
L40S = "room-l1"
WHOLE = list(range(8))


@pytest.fixture(scope="module", autouse=True)
def nodes(cluster: ClusterEnv) -> Iterator[None]:
    for name in DGX:
        cluster.add_node(name, "dgx-h100", gpus=8, labels={**POOL, keys.GPU_MODEL: H100})
    cluster.add_node(L40S, "l40s-8x-pcie", gpus=8, labels={**POOL, keys.GPU_MODEL: "L40S"})
    for name in (*DGX, L40S):
        cluster.wait_device(name)
    cluster.restart_allocators()
    yield
    for name in (*DGX, L40S):
        cluster.remove_node(name)
    cluster.restart_allocators()


def h100_gang(cluster: ClusterEnv, ns: str, group: str) -> list[dict[str, Any]]:
    """A 2 x 8-GPU gang held to H100, bound: its members, each on a DGX of its own with all 8 GPUs."""
    SCHEDULER_PLUGINS.create(cluster.cp, ns, group, 2)
    names = [f"{group}-{i}" for i in range(2)]
    for name in names:
        pod = gpu_pod(name, gpus=8, node_selector={**POOL, keys.GPU_MODEL: H100})
        cluster.create_pod(ns, SCHEDULER_PLUGINS.join(pod, group))
    members = [cluster.wait_bound(ns, name) for name in names]
    nodes = sorted(m["spec"]["nodeName"] for m in members)
    assert len(set(nodes)) == 2 and set(nodes) <= set(DGX), nodes
    assert all(gpu_minors(m) == WHOLE for m in members), [gpu_minors(m) for m in members]
    return members


def holds_on(cluster: ClusterEnv, nodes: tuple[str, ...]) -> list[str]:
    """The allocator's allocated-device samples on `nodes` (its cache, not the API server)."""
    return [k for k in held(cluster.leader()) if any(f'node="{n}"' in k for n in nodes)]


def test_an_unconstrained_pod_leaves_the_learned_gang_its_room(cluster: ClusterEnv, ns: str) -> None:
    h100_gang(cluster, ns, "pretrain")
    # The gang leaves; the allocator remembers its shape (2 members x 8 GPUs, held to H100).
    cluster.cp.admin.delete(f"{SP_PODGROUPS.format(ns=ns)}/pretrain")
    cluster.delete_pods(ns)
    wait_until(lambda: not holds_on(cluster, DGX), timeout=30, what="the gang's GPUs released in the cache")

    # Three whole DGX: taking one leaves two, room for the gang, so NVLink wins.
    cluster.create_pod(ns, gpu_pod("first", gpus=8, node_selector=POOL))
    first = cluster.wait_bound(ns, "first")
    assert first["spec"]["nodeName"] in DGX, first["spec"]["nodeName"]
    assert gpu_minors(first) == WHOLE

    # Two whole DGX: taking one would leave the gang one, so no NVLink credit there.
    cluster.create_pod(ns, gpu_pod("second", gpus=8, node_selector=POOL))
    second = cluster.wait_bound(ns, "second")
    assert second["spec"]["nodeName"] == L40S, second["spec"]["nodeName"]
    assert gpu_minors(second) == WHOLE

    # The room was kept: H100-only pods created after it (the gang again) each get a whole DGX.
    members = h100_gang(cluster, ns, "pretrain-again")
    assert first["spec"]["nodeName"] not in {m["spec"]["nodeName"] for m in members}
