"""Kubernetes' own gangs (scheduling.k8s.io) in the fake-API world: where kube-scheduler runs its
gang plugin they are not gated, planned whole and steered (filter is called again and again and
leaves nothing behind; a group that is rolled back holds nothing afterwards); without the plugin
they are gated like scheduler-plugins' gangs. The real control plane's side is
tests/cluster/test_native_gangs.py."""

from __future__ import annotations

from apis import keys
from tests.gang.harness import gang_runner, gang_world, gates_of, gpu_node, member, node_of
from tests.gang.native import (
    PODGROUPS_V1ALPHA2,
    WORKLOADS_V1ALPHA1,
    fingerprint,
    joined,
    native_condition,
    native_podgroup,
    rebuilt,
    serve_native_gangs,
    workload_v1alpha1,
)
from tests.support.allocator_harness import double_booked
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

NODES = ["n1", "n2"]
MEMBERS = ["w0", "w1", "w2"]
ROUNDS = 12  # filter calls per member before its bind


async def test_a_steered_gang_takes_many_filter_calls_per_bind_and_leaves_no_trace(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    serve_native_gangs(fake_api)
    for node in NODES:
        gpu_node(fake_api, node)
    # The stand-in kube-scheduler is kept away: this test plays kube-scheduler's repeated attempts.
    async with gang_world(fake_api, pki, hold=set(MEMBERS)) as w:
        await w.admission.create(PODGROUPS_V1ALPHA2, native_podgroup("trio", 3))
        for name in MEMBERS:  # 3 x 4 GPUs: two nodes
            created = await w.admission.create_pod(joined(member(name, gpus=4), "trio"))
            assert gates_of(created) == []  # kube-scheduler's gang plugin keeps it whole: no gate
        await until(lambda: len(w.gang_reservations()) == 3, 5)
        plan = w.gang_reservations()
        assert sorted(set(plan.values())) == NODES
        before = fingerprint(w.service)
        pods = w.pods()
        for _ in range(ROUNDS):
            for name in MEMBERS:
                got = await w.running.client.filter(pods[name], NODES)
                assert got["NodeNames"] == [plan[f"default/{name}"]]
                scores = await w.running.client.prioritize(pods[name], NODES)
                assert scores[plan[f"default/{name}"]] == 10
                assert fingerprint(w.service) == before  # filter and prioritize change nothing
        for name in MEMBERS:
            assert await w.running.client.bind(pods[name], plan[f"default/{name}"]) == ""
        await until(lambda: all(node_of(p) for p in w.pods().values()), 5)
        await until(lambda: w.service.cache.ledger.holds == {}, 5)
        assert not double_booked(list(w.pods().values()))
        assert fingerprint(w.service)[1:] == rebuilt(w.service, fake_api)  # no drift
        calls = w.running.metric("topoalloc_extender_requests_total", {"verb": "filter", "result": "ok"})
        assert calls is not None and calls >= ROUNDS * len(MEMBERS)
        await until(lambda: native_condition(fake_api, "trio", "topoalloc.io/Scheduled") == "True", 5)


async def test_a_rolled_back_gang_holds_nothing_once_it_is_given_up(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    serve_native_gangs(fake_api)
    for node in NODES:
        gpu_node(fake_api, node)
    empty = None
    async with gang_world(fake_api, pki, hold=set(MEMBERS), bind_timeout=1.0) as w:
        empty = fingerprint(w.service)
        await w.admission.create(PODGROUPS_V1ALPHA2, native_podgroup("trio", 3))
        for name in MEMBERS:
            await w.admission.create_pod(joined(member(name, gpus=4), "trio"))
        await until(lambda: len(w.gang_reservations()) == 3, 5)
        pods = w.pods()
        # kube-scheduler evaluates the members again and again and rolls the group back (one member
        # fails a check of its own): no bind ever comes.
        for _ in range(ROUNDS):
            for name in MEMBERS:
                await w.running.client.filter(pods[name], NODES)
        # Not bound within bindTimeout: the plan is released, with an Event, and made again; never
        # two plans' holds at once.
        await until(lambda: any("not bound within" in n for n in w.notes_about("trio", "PodGroup")), 5)
        assert len(w.gang_reservations()) <= 3
        assert len([d for d in fingerprint(w.service)[2] if d[1] == "gpu"]) <= 2
        for name in MEMBERS:  # the Job gives up
            await w.admission.delete_pod(name)
        await until(lambda: w.service.cache.ledger.holds == {}, 5)
        assert fingerprint(w.service) == empty
        assert rebuilt(w.service, fake_api) == empty[1:]
        # And the room is really free: an 8-GPU pod fits on each node.
        w.scheduler.release(*MEMBERS)
        for node in NODES:
            await w.admission.create_pod(member(f"whole-{node}", gpus=8))
        await until(lambda: all(node_of(w.pods()[f"whole-{n}"]) for n in NODES), 5)


async def test_without_kube_schedulers_gang_plugin_native_members_are_gated(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    serve_native_gangs(fake_api)
    gpu_node(fake_api, "n1")
    async with gang_world(fake_api, pki, gang_plugin_schedulers=[]) as w:
        for name in ("w0", "w1"):
            created = await w.admission.create_pod(joined(member(name, gpus=4), "pair"))
            assert gates_of(created) == [keys.GANG_SCHEDULING_GATE]
        await gang_runner(w).wait_passes(2)
        assert all(not node_of(p) for p in w.pods().values())  # no PodGroup yet: it waits
        await w.admission.create(PODGROUPS_V1ALPHA2, native_podgroup("pair", 2))
        await until(lambda: all(node_of(p) == "n1" for p in w.pods().values()), 5)
        assert not double_booked(list(w.pods().values()))


async def test_a_1_35_workload_pod_group_binds_whole(fake_api: FakeApiServer, pki: Pki) -> None:
    serve_native_gangs(fake_api, "v1alpha1")
    gpu_node(fake_api, "n1")
    async with gang_world(fake_api, pki) as w:
        await w.admission.create(WORKLOADS_V1ALPHA1, workload_v1alpha1("train", {"workers": 2, "ps": 1}))
        first = await w.admission.create_pod(joined(member("w0", gpus=4), "workers", workload="train"))
        assert gates_of(first) == []
        await until(lambda: w.scheduler.attempts["default/w0"] > 0, 5)
        await gang_runner(w).wait_passes(2)
        assert not node_of(w.pods()["w0"])  # held for its gang: 1 of 2
        await w.admission.create_pod(joined(member("w1", gpus=4), "workers", workload="train"))
        await w.admission.create_pod(joined(member("ps", gpus=0), "ps", workload="train"))
        await until(lambda: all(node_of(w.pods()[n]) == "n1" for n in ("w0", "w1")), 5)
        planned = [n for n in w.notes_about("train", "Workload") if n.startswith("planned 2 member(s)")]
        assert planned, w.notes_about("train", "Workload")
