"""Gangs and ordinary pods together, and a 16-worker RL job placed close together."""

from __future__ import annotations

import random

import pytest

from apis import keys
from tests.gang.harness import (
    RACK,
    bound_elsewhere,
    gang_world,
    gates_of,
    gpu_node,
    member,
    node_of,
    podgroup,
)
from tests.support.allocator_harness import double_booked, node_view, rebuilt_from_api
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until


async def test_gangs_and_ordinary_pods_never_double_book_and_a_waiting_gang_starves_nobody(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    for name in ("n1", "n2", "n3"):
        gpu_node(fake_api, name)
    async with gang_world(fake_api, pki) as w:
        for i in range(4):
            await w.admission.create_pod(member(f"early{i}", gpus=1))
        await until(lambda: all(node_of(p) for p in w.pods().values()), 10)
        # "wide" wants every GPU of the cluster at once: it waits, holding nothing.
        await w.admission.create_podgroup(podgroup("wide", 3))
        for i in range(3):
            await w.admission.create_pod(member(f"wide{i}", group="wide", gpus=8))
        await w.admission.create_podgroup(podgroup("pair", 2))
        await w.admission.create_podgroup(podgroup("quad", 4))
        later = [member(f"late{i}", gpus=1 + i % 2) for i in range(8)]
        later += [member(f"pair{i}", group="pair", gpus=2) for i in range(2)]
        later += [member(f"quad{i}", group="quad", gpus=1) for i in range(4)]
        random.Random(7).shuffle(later)
        for pod in later:
            await w.admission.create_pod(pod)

        def settled() -> bool:
            pods = w.pods()
            return all(node_of(p) for n, p in pods.items() if not n.startswith("wide"))

        await until(settled, 15)  # 4 + 12 + 4 + 4 = 24 GPUs would be needed with "wide": it waits
        pods = w.pods()
        assert double_booked(pods.values()) == []
        assert not any(node_of(pods[f"wide{i}"]) for i in range(3))
        assert all(gates_of(pods[f"wide{i}"]) == [keys.GANG_SCHEDULING_GATE] for i in range(3))
        assert w.podgroup_status("wide")["phase"] == "PreScheduling"
        await until(lambda: w.gang_reservations() == {}, 5)  # once the watch shows the last binds
        # What the allocator counts is exactly what the API server says is bound.
        await until(lambda: node_view(w.service.core) == node_view(rebuilt_from_api(w.fake)), 5)

        for name in [n for n in pods if not n.startswith("wide")]:
            await w.admission.delete_pod(name)
        await until(lambda: all(node_of(w.pods()[f"wide{i}"]) for i in range(3)), 10)
        pods = w.pods()
        assert sorted(node_of(pods[f"wide{i}"]) for i in range(3)) == ["n1", "n2", "n3"]
        assert double_booked(pods.values()) == []
        await until(lambda: node_view(w.service.core) == node_view(rebuilt_from_api(w.fake)), 5)


@pytest.mark.parametrize("round_trips", [1, 2])
async def test_a_16_worker_rl_job_takes_the_fewest_nodes_of_one_rack(
    fake_api: FakeApiServer, pki: Pki, round_trips: int
) -> None:
    # r1: n1 (8 free), n2 (4 free); r2: n3, n4, n5 (8 free each); r3: n6 (8 free).
    # Fewest nodes for 16 one-GPU workers: 2. One rack that can hold them on 2 nodes: r2.
    racks = {"n1": "r1", "n2": "r1", "n3": "r2", "n4": "r2", "n5": "r2", "n6": "r3"}
    for name, rack in racks.items():
        gpu_node(fake_api, name, {RACK: rack})
    bound_elsewhere(fake_api, "tenant", "n2", [0, 1, 2, 3])
    job = {keys.RL_JOB_GROUP: "ppo-7"}
    async with gang_world(fake_api, pki, round_trips=round_trips) as w:
        await w.admission.create_podgroup(podgroup("ppo-7-workers", 16))
        for i in range(16):
            await w.admission.create_pod(member(f"worker{i:02d}", group="ppo-7-workers", labels=job))
        await until(lambda: all(node_of(p) for n, p in w.pods().items() if n.startswith("worker")), 15)
        pods = w.pods()
        used = {node_of(p) for n, p in pods.items() if n.startswith("worker")}
        assert len(used) == 2 and {racks[n] for n in used} == {"r2"}
        assert double_booked(pods.values()) == []
        planned = w.notes_about("ppo-7-workers", "PodGroup")
        assert any(f"({RACK}=r2)" in n for n in planned), planned

        # A later pod of the same job (not in the gang) goes next to its siblings: the free
        # node of their rack, although the scorer alone ranks another node first.
        (spare,) = {"n3", "n4", "n5"} - used
        room = ["n1", "n2", spare, "n6"]
        probe = w.service.core.request(member("probe", gpus=1))
        alone = dict(zip(room, w.service.core.score_nodes(probe, room).tolist(), strict=True))
        assert max(alone, key=alone.__getitem__) != spare
        await w.admission.create_pod(member("evaluator", gpus=1, labels=job))
        await until(lambda: node_of(w.pods()["evaluator"]) != "", 10)
        assert node_of(w.pods()["evaluator"]) == spare
        # One round trip: the sibling affinity decided in filter; prioritize was never asked.
        asked = w.running.metric("topoalloc_extender_requests_total", {"verb": "prioritize", "result": "ok"})
        assert (asked is None) == (round_trips == 1)
