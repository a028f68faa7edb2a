"""Placement mode end to end on the fake API server: GPU pods of any scheduler gated at admission,
placed by topology, pinned to their node and bound by (a stand-in for) the cluster's own
kube-scheduler; every device counted once."""

from __future__ import annotations

from apis import keys
from tests.placement.harness import allocated, gpu_node, gpu_pod, placement_world
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

# The DGX H100 fixture: all eight GPUs on one NVSwitch; a pair on a PCIe switch (0-1, 2-3, ...).


async def test_a_gpu_pod_of_the_default_scheduler_is_placed_pinned_and_bound(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    async with placement_world(fake_api, pki) as w:
        created = await w.admission.create_pod(gpu_pod("train", 2))
        assert [g["name"] for g in created["spec"]["schedulingGates"]] == [keys.PLACEMENT_GATE]
        await until(lambda: w.pod("train")["spec"].get("nodeName"), what="train bound")
        pod = w.pod("train")
        node, minors = allocated(pod)
        assert pod["spec"]["nodeName"] == node == pod["status"]["nominatedNodeName"]
        assert len(minors) == 2 and not pod["spec"].get("schedulingGates")
        # The allocator counts them: a second pod never gets the same GPUs.
        await w.admission.create_pod(gpu_pod("second", 4))
        await until(lambda: w.pod("second")["spec"].get("nodeName"), what="second bound")
        node2, minors2 = allocated(w.pod("second"))
        assert node2 == node and not set(minors2) & set(minors)  # packed, never the same GPU


async def test_pods_asking_for_no_device_or_opting_out_are_not_gated(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    async with placement_world(fake_api, pki) as w:
        cpu = gpu_pod("cpu")
        cpu["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
        out = gpu_pod("out", metadata={"labels": {keys.PLACEMENT: "false"}})
        for pod in (cpu, out):
            created = await w.admission.create_pod(pod)
            assert not created["spec"].get("schedulingGates")
        await until(lambda: w.pod("out")["spec"].get("nodeName"), what="out bound by kube-scheduler")
        assert keys.DEVICE_ALLOCATED not in (w.pod("out")["metadata"].get("annotations") or {})


async def test_no_gpu_is_placed_twice_in_a_burst_and_the_rest_say_why(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    async with placement_world(fake_api, pki) as w:
        for i in range(20):
            await w.admission.create_pod(gpu_pod(f"p{i}", 1))
        await until(lambda: sum(1 for p in fake_api.list_objects("pods") if p["spec"].get("nodeName")) == 16,
                    what="16 of 20 bound")  # fmt: skip
        pods = fake_api.list_objects("pods")
        used = [(allocated(p)[0], m) for p in pods if p["spec"].get("nodeName") for m in allocated(p)[1]]
        assert len(used) == len(set(used)) == 16
        waiting = [p for p in pods if not p["spec"].get("nodeName")]
        assert len(waiting) == 4
        for pod in waiting:
            assert [g["name"] for g in pod["spec"]["schedulingGates"]] == [keys.PLACEMENT_GATE]
        name = waiting[0]["metadata"]["name"]
        await until(
            lambda: any(e["reason"] == "FailedPlacement" for e in w.events_about(name)), what="an Event"
        )
        note = next(e["note"] for e in w.events_about(name) if e["reason"] == "FailedPlacement")
        assert note.startswith("0/2 nodes can host the pod's devices"), note
        await until(lambda: any(c["type"] == "topoalloc.io/Placed" for c in w.pod(name)["status"].get("conditions") or []),
                    what="the condition")  # fmt: skip
        # Room frees: a waiting pod is placed at once, not at its next retry.
        bound = next(p["metadata"]["name"] for p in pods if p["spec"].get("nodeName"))
        fake_api.remove("pods", bound, "default")
        await until(lambda: sum(1 for p in fake_api.list_objects("pods") if p["spec"].get("nodeName")) == 16,
                    what="a waiting pod placed on the freed GPU")  # fmt: skip


async def test_a_bare_pod_is_nominated_and_bound_elsewhere_when_its_node_refuses(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    async with placement_world(fake_api, pki) as w:
        w.scheduler.held.add("p")
        await w.admission.create_pod(gpu_pod("p", 8))
        await until(lambda: allocated(w.pod("p"))[0], what="p placed")
        first = allocated(w.pod("p"))[0]
        pod = w.pod("p")
        assert pod["status"]["nominatedNodeName"] == first and not pod["spec"].get(
            "affinity"
        )  # no controller
        assert w.run.service.cache.ledger.holds["default/p"].node == first
        w.scheduler.refuse = {first: "1 node(s) had volume node affinity conflict"}
        w.scheduler.held.clear()
        await until(lambda: w.pod("p")["spec"].get("nodeName"), what="p bound")
        assert w.pod("p")["spec"]["nodeName"] != first  # kube-scheduler went elsewhere: it runs
        # The hold on the node it did not get is gone: its GPUs are free for the next pod.
        await until(lambda: "default/p" not in w.run.service.cache.ledger.holds, what="the hold dropped")


async def test_a_controlled_pod_pinned_by_affinity_is_created_anew_when_its_node_refuses(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    gpu_node(fake_api, "n1")
    gpu_node(fake_api, "n2")
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": True}
    async with placement_world(fake_api, pki) as w:
        w.scheduler.held.add("rs-a")
        await w.admission.create_pod(gpu_pod("rs-a", 8, metadata={"ownerReferences": [owner]}))
        await until(lambda: allocated(w.pod("rs-a"))[0], what="rs-a placed")
        first = allocated(w.pod("rs-a"))[0]
        terms = w.pod("rs-a")["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert terms["nodeSelectorTerms"] == [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [first]}]}
        ]
        assert not (w.pod("rs-a").get("status") or {}).get("nominatedNodeName")  # one write: no nomination
        w.scheduler.refuse = {first: "1 node(s) had volume node affinity conflict"}
        w.scheduler.held.clear()
        # Pinned where kube-scheduler refuses it: evicted, so its controller creates it anew.
        await until(lambda: fake_api.get("pods", "rs-a", "default") is None, what="rs-a evicted")
        assert any(e["reason"] == "Replacing" for e in w.events_about("rs-a"))
        await w.admission.create_pod(
            gpu_pod("rs-b", 8, metadata={"ownerReferences": [owner]})
        )  # the ReplicaSet
        await until(lambda: w.pod("rs-b")["spec"].get("nodeName"), what="rs-b bound")
        assert w.pod("rs-b")["spec"]["nodeName"] == allocated(w.pod("rs-b"))[0] != first


async def test_a_pod_of_the_second_scheduler_of_an_earlier_install_is_placed_and_bound(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    """After an upgrade from secondary mode no topoalloc-scheduler runs: its pods keep their
    schedulerName, and topoalloc places and binds them itself, with no gate."""
    gpu_node(fake_api, "n1")
    async with placement_world(fake_api, pki) as w:
        w.scheduler.held.add("old")  # the stand-in is not topoalloc-scheduler: it never binds it
        created = await w.admission.create_pod(gpu_pod("old", 2, schedulerName="topoalloc-scheduler"))
        assert not created["spec"].get("schedulingGates")
        await until(lambda: w.pod("old")["spec"].get("nodeName"), what="old bound by topoalloc")
        pod = w.pod("old")
        assert allocated(pod) == (pod["spec"]["nodeName"], allocated(pod)[1]) and len(allocated(pod)[1]) == 2
