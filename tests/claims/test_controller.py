"""The claims controller with the real allocator against the fake API server: gate, allocate,
ungate; what it refuses and why; claims allocated by others counting as used; re-allocation when
kube-scheduler refuses the node; nothing half-written when a write fails; unused claims released."""

from __future__ import annotations

import asyncio
from typing import Any

from allocator.core.request.claims import PCIE_SWITCH
from apis import dra
from tests.claims.harness import (
    CLAIMS,
    FAST,
    allocation,
    bind_like_kube_scheduler,
    claims_world,
    devices_of,
    dra_node,
    events,
    gates,
    make_claims,
    node_of_claim,
    refuse_like_kube_scheduler,
    serve_dra,
)
from tests.claims.objects import claim, claim_pod, gpus, template
from tests.gang.native import joined, native_podgroup, serve_native_gangs, workload_v1alpha1
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until

PAIR = "topoalloc.io/nvlinkPartition2"


async def test_a_template_claim_is_allocated_then_the_pod_ungated(fake_api: FakeApiServer, pki: Pki) -> None:
    serve_dra(fake_api)
    dra_node(fake_api, "n1")
    fake_api.put(template("pair", gpus(2, match=PAIR)))
    async with claims_world(fake_api, pki) as w:
        await until(lambda: "n1" in w.run.service.cache.dra.published, what="n1's pool")
        await w.create_pod(claim_pod("p", templates={"gpus": "pair"}))
        assert gates(fake_api, "p") == [dra.SCHEDULING_GATE]  # the webhook gated it
        await w.looked_at("p")
        assert gates(fake_api, "p") == [dra.SCHEDULING_GATE]  # no claim yet: it waits
        (name,) = make_claims(fake_api, "p")
        await until(lambda: not gates(fake_api, "p"), what="the gate removed")
        stored = fake_api.get(CLAIMS, name, "default")
        assert stored is not None
        assert stored["metadata"]["annotations"][dra.ALLOCATED_BY_ANNOTATION] == dra.ALLOCATED_BY
        assert node_of_claim(fake_api, name) == "n1"
        assert sorted(devices_of(fake_api, name)) in (
            ["gpu-0", "gpu-1"],
            ["gpu-2", "gpu-3"],
            ["gpu-4", "gpu-5"],
            ["gpu-6", "gpu-7"],
        )
        assert {r["request"] for r in allocation(fake_api, name)["devices"]["results"]} == {"gpus"}
        # Reserved for the pod in the allocation's own write: kube-scheduler's PreBind writes
        # nothing for it (no Event either: the claim shows the devices).
        uid = (fake_api.get("pods", "p", "default") or {})["metadata"]["uid"]
        assert stored["status"]["reservedFor"] == [{"resource": "pods", "name": "p", "uid": uid}]
        # The controller runs on the runner, its passes counted on the process's registry.
        passes = w.run.service.metrics.registry.get_sample_value(
            "topoalloc_controller_passes_total", {"controller": "claims"}
        )
        assert passes is not None and passes >= 2


async def test_two_pods_never_get_the_same_device(fake_api: FakeApiServer, pki: Pki) -> None:
    serve_dra(fake_api)
    dra_node(fake_api, "n1")
    fake_api.put(template("four", gpus(4)))
    async with claims_world(fake_api, pki) as w:
        await until(lambda: "n1" in w.run.service.cache.dra.published)
        for name in ("a", "b", "c"):
            await w.create_pod(claim_pod(name, templates={"gpus": "four"}))
            make_claims(fake_api, name)
        await until(lambda: not gates(fake_api, "a") and not gates(fake_api, "b"), what="two pods ungated")
        got = devices_of(fake_api, "a-gpus") + devices_of(fake_api, "b-gpus")
        assert sorted(got) == [f"gpu-{m}" for m in range(8)]
        # The third fits nowhere: it stays gated, holds nothing and says why.
        await until(lambda: events(fake_api, "DRAAllocationFailed"), what="the third pod's Event")
        assert gates(fake_api, "c") == [dra.SCHEDULING_GATE] and allocation(fake_api, "c-gpus") is None
        assert "0/1 nodes can take the claims" in events(fake_api, "DRAAllocationFailed")[0]
        # Room again (a's pod and claim gone): the third is allocated.
        fake_api.remove("pods", "a", "default")
        fake_api.remove(CLAIMS, "a-gpus", "default")
        await until(lambda: not gates(fake_api, "c"), what="the third pod ungated")


async def test_gpu_and_nic_on_one_switch(fake_api: FakeApiServer, pki: Pki) -> None:
    serve_dra(fake_api)
    dra_node(fake_api, "n1")
    devices = {
        "requests": [
            {"name": "gpu", "exactly": {"deviceClassName": dra.GPU_CLASS}},
            {"name": "vf", "exactly": {"deviceClassName": dra.RDMA_VF_CLASS}},
        ],
        "constraints": [{"requests": ["gpu", "vf"], "matchAttribute": PCIE_SWITCH}],
    }
    fake_api.put(template("gpu-vf", devices))
    async with claims_world(fake_api, pki) as w:
        await until(lambda: "n1" in w.run.service.cache.dra.published)
        await w.create_pod(claim_pod("p", templates={"d": "gpu-vf"}))
        make_claims(fake_api, "p")
        await until(lambda: not gates(fake_api, "p"))
        gpu, vf = devices_of(fake_api, "p-d")
        published = w.run.service.cache.dra.published["n1"].devices
        assert published[gpu].attribute(PCIE_SWITCH) == published[vf].attribute(PCIE_SWITCH)
        assert vf.startswith("rdma-") and "-vf-" in vf


async def test_claims_topoalloc_does_not_allocate(fake_api: FakeApiServer, pki: Pki) -> None:
    serve_dra(fake_api)
    dra_node(fake_api, "n1")
    fake_api.put(
        template("opted-out", gpus(1), annotations={dra.ALLOCATOR_ANNOTATION: dra.ALLOCATOR_KUBE_SCHEDULER})
    )
    fake_api.put(
        template(
            "capacity",
            {
                "requests": [
                    {
                        "name": "g",
                        "exactly": {
                            "deviceClassName": dra.RDMA_CLASS,
                            "capacity": {"requests": {"memory": "1Gi"}},
                        },
                    }
                ]
            },
        )
    )
    fake_api.put(template("bad-cel", gpus(1, selectors=('semver("1.0.0").isGreaterThan(semver("0.1.0"))',))))
    async with claims_world(fake_api, pki) as w:
        await until(lambda: "n1" in w.run.service.cache.dra.published)
        # Opted out: never gated, kube-scheduler's to allocate.
        await w.create_pod(claim_pod("out", templates={"g": "opted-out"}))
        assert gates(fake_api, "out") == []
        # Refused: gated, an Event, the claim untouched.
        for name, tmpl in (("cap", "capacity"), ("cel", "bad-cel")):
            await w.create_pod(claim_pod(name, templates={"g": tmpl}))
            make_claims(fake_api, name)
        await until(
            lambda: events(fake_api, "DRAClaimRefused") and events(fake_api, "DRAAllocationFailed"),
            what="both Events",
        )
        assert "RDMA NICs and VFs are handed out whole" in events(fake_api, "DRAClaimRefused")[0]
        assert "unsupported selector" in events(fake_api, "DRAAllocationFailed")[0]
        for name in ("cap", "cel"):
            assert (
                gates(fake_api, name) == [dra.SCHEDULING_GATE] and allocation(fake_api, f"{name}-g") is None
            )


async def test_a_claim_kube_scheduler_allocated_counts_as_used(fake_api: FakeApiServer, pki: Pki) -> None:
    serve_dra(fake_api)
    dra_node(fake_api, "n1")
    fake_api.put(template("four", gpus(4)))
    taken = claim("theirs", gpus(1), annotations={dra.ALLOCATOR_ANNOTATION: dra.ALLOCATOR_KUBE_SCHEDULER})
    async with claims_world(fake_api, pki) as w:
        await until(lambda: "n1" in w.run.service.cache.dra.published)
        fake_api.put(taken)
        obj = fake_api.get(CLAIMS, "theirs", "default")
        assert obj is not None
        results = [{"request": "gpus", "driver": dra.DRIVER, "pool": "n1", "device": "gpu-5"}]
        obj["status"] = {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                    ]
                },
            }
        }
        fake_api.put(obj)
        # The node's partition table has two quads; gpu-5 is in the second.
        await w.create_pod(claim_pod("p", templates={"gpus": "four"}))
        make_claims(fake_api, "p")
        await until(lambda: not gates(fake_api, "p"))
        assert sorted(devices_of(fake_api, "p-gpus")) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
        await w.create_pod(claim_pod("q", templates={"gpus": "four"}))
        make_claims(fake_api, "q")
        await until(lambda: events(fake_api, "DRAAllocationFailed"), what="no quad left")
        assert allocation(fake_api, "q-gpus") is None


async def test_a_shared_claim_is_allocated_once_and_pins_later_pods(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    serve_dra(fake_api)
    dra_node(fake_api, "n1")
    dra_node(fake_api, "n2")
    fake_api.put(claim("shared", gpus(2)))
    async with claims_world(fake_api, pki) as w:
        await until(lambda: len(w.run.service.cache.dra.published) == 2)
        await until(lambda: "default/shared" in w.run.service.cache.dra.claims)
        await w.create_pod(claim_pod("a", claims={"g": "shared"}))
        await until(lambda: not gates(fake_api, "a"))
        node = node_of_claim(fake_api, "shared")
        first = devices_of(fake_api, "shared")
        bind_like_kube_scheduler(fake_api, "a", ["shared"])
        # An allocated claim needs no gate: kube-scheduler follows its node selector.
        await w.create_pod(claim_pod("b", claims={"g": "shared"}))
        assert gates(fake_api, "b") == []
        await w.looked_at("b")
        assert devices_of(fake_api, "shared") == first and node_of_claim(fake_api, "shared") == node


async def test_refused_on_its_node_the_pod_is_allocated_elsewhere(fake_api: FakeApiServer, pki: Pki) -> None:
    serve_dra(fake_api)
    dra_node(fake_api, "n1")
    dra_node(fake_api, "n2")
    fake_api.put(template("one", gpus(1)))
    async with claims_world(fake_api, pki) as w:
        await until(lambda: len(w.run.service.cache.dra.published) == 2)
        await w.create_pod(claim_pod("p", templates={"g": "one"}))
        make_claims(fake_api, "p")
        await until(lambda: not gates(fake_api, "p"))
        first = node_of_claim(fake_api, "p-g")
        refuse_like_kube_scheduler(fake_api, "p", f"0/2 nodes are available: 1 Insufficient cpu on {first}")
        await until(
            lambda: allocation(fake_api, "p-g") and node_of_claim(fake_api, "p-g") != first, what="moved"
        )
        assert events(fake_api, "DRAReallocated") and first in events(fake_api, "DRAReallocated")[0]
        # The allocation's write had reserved it for p: cleared with it, and reserved again with the
        # new allocation.
        stored = fake_api.get(CLAIMS, "p-g", "default")
        assert stored is not None and [r["name"] for r in stored["status"]["reservedFor"]] == ["p"]


async def test_a_failed_write_leaves_nothing_half_written(fake_api: FakeApiServer, pki: Pki) -> None:
    serve_dra(fake_api)
    dra_node(fake_api, "n1")
    fake_api.put(template("one", gpus(1)))
    async with claims_world(fake_api, pki) as w:
        await until(lambda: "n1" in w.run.service.cache.dra.published)
        pod = claim_pod("p", templates={"a": "one", "b": "one"})
        await w.create_pod(pod)
        # The second claim's status write fails: the first one's is rolled back every time.
        fake_api.inject_fault("PATCH", "/resourceclaims/p-b/status", status=500, times=None)
        made = make_claims(fake_api, "p")
        await until(lambda: events(fake_api, "DRAAllocationFailed"), what="the failure")
        # The controller keeps retrying (write a, fail b, roll a back): a fixed sleep could land inside
        # an attempt on a busy machine; between attempts neither claim holds an allocation.
        seen: list[dict[str, Any]] = []  # the first claim's status as the check found it rolled back

        def rolled_back() -> bool:
            status = (fake_api.get(CLAIMS, "p-a", "default") or {}).get("status") or {}
            seen[:] = [status]
            return status.get("allocation") is None and allocation(fake_api, "p-b") is None

        await until(rolled_back, what="the first claim's allocation rolled back")
        # Its reservation went with it (the API server refuses one without an allocation).
        assert "reservedFor" not in seen[0]
        assert gates(fake_api, "p") == [dra.SCHEDULING_GATE]
        fake_api.clear_faults()
        await until(lambda: not gates(fake_api, "p"), what="allocated on the retry")
        assert len(devices_of(fake_api, made[0])) == 1 and len(devices_of(fake_api, made[1])) == 1
        assert not set(devices_of(fake_api, made[0])) & set(devices_of(fake_api, made[1]))


async def test_a_claim_nothing_uses_is_released(fake_api: FakeApiServer, pki: Pki) -> None:
    serve_dra(fake_api)
    dra_node(fake_api, "n1")
    fake_api.put(claim("standalone", gpus(1)))
    async with claims_world(fake_api, pki) as w:
        await until(lambda: "default/standalone" in w.run.service.cache.dra.claims)
        await w.create_pod(claim_pod("a", claims={"g": "standalone"}))
        await until(lambda: allocation(fake_api, "standalone"))
        # Longer than releaseAfter, then a full pass: its pod still names it, it stays.
        await asyncio.sleep(FAST.release_after)
        w.runner.resync()
        await w.runner.wait_passes(2)
        assert allocation(fake_api, "standalone") is not None
        fake_api.remove("pods", "a", "default")
        # kube-controller-manager drops the reservation of a pod that is gone (the allocation's
        # write reserved the claim for it).
        stored = fake_api.get(CLAIMS, "standalone", "default")
        assert stored is not None and [r["name"] for r in stored["status"]["reservedFor"]] == ["a"]
        del stored["status"]["reservedFor"]
        fake_api.put(stored)
        await until(lambda: allocation(fake_api, "standalone") is None, what="released")


async def test_a_gang_of_claims_is_allocated_whole_then_ungated(fake_api: FakeApiServer, pki: Pki) -> None:
    serve_dra(fake_api)
    for name in ("n1", "n2"):
        dra_node(fake_api, name)
    fake_api.put(template("eight", gpus(8)))
    fake_api.put(
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "g", "namespace": "default"},
            "spec": {"minMember": 2},
        }
    )
    fake_api.put(
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "big", "namespace": "default"},
            "spec": {"minMember": 3},
        }
    )
    async with claims_world(fake_api, pki) as w:
        await until(lambda: len(w.run.service.cache.dra.published) == 2)
        members = []
        for group, names in (("g", ("g-0", "g-1")), ("big", ("big-0", "big-1", "big-2"))):
            for name in names:
                pod = claim_pod(name, templates={"gpus": "eight"})
                pod["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": group}
                await w.create_pod(pod)
                members.append(name)
        make_claims(fake_api, "g-0")
        await w.looked_at("g-0", ["g-0-gpus"])
        assert allocation(fake_api, "g-0-gpus") is None  # its sibling's claim is not made yet
        for name in members[1:]:
            make_claims(fake_api, name)
        await until(
            lambda: not gates(fake_api, "g-0") and not gates(fake_api, "g-1"), what="the gang ungated"
        )
        assert {node_of_claim(fake_api, "g-0-gpus"), node_of_claim(fake_api, "g-1-gpus")} == {"n1", "n2"}
        # Three members of eight GPUs on two nodes: none is allocated, each says why.
        await until(lambda: len(events(fake_api, "DRAAllocationFailed")) >= 3, what="the big gang's Events")
        assert all("gang default/big" in e for e in events(fake_api, "DRAAllocationFailed"))
        for name in ("big-0", "big-1", "big-2"):
            assert allocation(fake_api, f"{name}-gpus") is None and gates(fake_api, name) == [
                dra.SCHEDULING_GATE
            ]


async def test_a_koordinator_gang_of_claims_waits_for_its_min_available(
    fake_api: FakeApiServer, pki: Pki
) -> None:
    serve_dra(fake_api)
    dra_node(fake_api, "n1")
    fake_api.put(template("one", gpus(1)))
    async with claims_world(fake_api, pki) as w:
        await until(lambda: "n1" in w.run.service.cache.dra.published)
        names = ("k-0", "k-1")
        for name in names:
            pod = claim_pod(name, templates={"g": "one"})
            pod["metadata"]["annotations"] = {
                "gang.scheduling.koordinator.sh/name": "k",
                "gang.scheduling.koordinator.sh/min-available": "2",
            }
            await w.create_pod(pod)
        make_claims(fake_api, "k-0")
        await w.looked_at("k-0", ["k-0-g"])
        assert allocation(fake_api, "k-0-g") is None  # one of two members: it waits
        make_claims(fake_api, "k-1")
        await until(lambda: not gates(fake_api, "k-0") and not gates(fake_api, "k-1"), what="both ungated")
        (a,), (b,) = devices_of(fake_api, "k-0-g"), devices_of(fake_api, "k-1-g")
        assert a != b


async def test_a_native_gang_of_claims_waits_for_its_min_count(fake_api: FakeApiServer, pki: Pki) -> None:
    """Kubernetes' own PodGroup (1.36) and a 1.35 Workload's pod group size a gang of claims as a
    scheduler-plugins PodGroup does: nothing is allocated until minCount members have claims."""
    serve_dra(fake_api)
    serve_native_gangs(fake_api)
    serve_native_gangs(fake_api, "v1alpha1")
    dra_node(fake_api, "n1")
    fake_api.put(template("one", gpus(1)))
    fake_api.put(native_podgroup("ng", 2))
    fake_api.put(workload_v1alpha1("wl", {"workers": 2}))
    async with claims_world(fake_api, pki) as w:
        await until(lambda: "n1" in w.run.service.cache.dra.published)
        await until(lambda: w.run.service.cache.native_podgroups and w.run.service.cache.workloads)
        for name, group, workload in (
            ("n-0", "ng", ""),
            ("n-1", "ng", ""),
            ("w-0", "workers", "wl"),
            ("w-1", "workers", "wl"),
        ):
            await w.create_pod(joined(claim_pod(name, templates={"g": "one"}), group, workload=workload))
        make_claims(fake_api, "n-0")
        make_claims(fake_api, "w-0")
        await w.looked_at("n-0", ["n-0-g"])
        await w.looked_at("w-0", ["w-0-g"])
        assert allocation(fake_api, "n-0-g") is None and allocation(fake_api, "w-0-g") is None  # one of two
        make_claims(fake_api, "n-1")
        make_claims(fake_api, "w-1")
        await until(
            lambda: not any(gates(fake_api, n) for n in ("n-0", "n-1", "w-0", "w-1")), what="all ungated"
        )
        assert len({devices_of(fake_api, f"{n}-g")[0] for n in ("n-0", "n-1", "w-0", "w-1")}) == 4
