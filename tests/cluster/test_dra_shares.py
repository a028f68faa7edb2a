"""GPU shares on DRA on the real control plane: a DGX H100 in dra mode whose agent publishes its
GPUs sharable where the API server keeps consumable capacity (1.36) and whole where it drops it
(1.35). On 1.36 a pair of share claims lands on one GPU with what they consume summing to at most
the GPU, a third waits with an Event, and topoalloc writes its results in the form kube-scheduler
writes its own (shareID, consumedCapacity by the slice's capacity names); on 1.35, where the API
server would drop a share's capacity.requests, a claim or template asking one is refused at its
creation saying the GPUs are whole only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from apis import dra
from apis.quantity import Quantity
from tests.cluster.dra import CLAIMS, TEMPLATES, DraNode, node_slices, running_dra_nodes, start_dra_node
from tests.cluster.dra_claims import (
    OPT_OUT,
    allocated_claim,
    claim_of,
    claim_pod,
    cleanup,
    create_template,
    event_notes,
    gates,
    gpu_template,
)
from tests.cluster.harness import ClusterEnv
from tests.support.controlplane import wait_until
from tests.support.rest import ApiStatus

NODE = "dra-share"
GPU0 = f'device.attributes["{dra.DRIVER}"].minor == 0'  # the pair and the third on one GPU
JSON = dict[str, Any]


@pytest.fixture(scope="module")
def node(cluster: ClusterEnv) -> Iterator[DraNode]:
    with running_dra_nodes(cluster, {NODE: start_dra_node(cluster, NODE, "dgx-h100")}) as running:
        yield running[NODE]


def share_template(
    name: str, ns: str, cores: str, memory: str, *, annotations: dict[str, str] | None = None
) -> JSON:
    template = gpu_template(name, 1, ns, annotations=annotations)
    exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    exactly["capacity"] = {"requests": {dra.CAPACITY_CORES: cores, dra.CAPACITY_MEMORY: memory}}
    exactly["selectors"] = [{"cel": {"expression": GPU0}}]
    return template


def result_of(claim: JSON) -> JSON:
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return dict(result)


@pytest.mark.k8s(min="1.36")
def test_a_share_pair_lands_on_one_gpu_and_a_third_waits(cluster: ClusterEnv, node: DraNode, ns: str) -> None:
    create_template(cluster, share_template("half", ns, "50", "40000Mi"))
    create_template(cluster, share_template("tenth", ns, "10", "1Gi"))
    got, claims = [], []
    for pod in ("a", "b"):
        cluster.create_pod(ns, claim_pod(pod, "half", ns))
        assert gates(cluster, ns, pod) == [dra.SCHEDULING_GATE]
        cluster.wait_bound(ns, pod)
        claim = allocated_claim(cluster, ns, pod)
        assert claim["metadata"]["annotations"][dra.ALLOCATED_BY_ANNOTATION] == dra.ALLOCATED_BY
        got.append(result_of(claim))
        claims.append(claim)
    assert [r["device"] for r in got] == ["gpu-0", "gpu-0"]
    assert got[0]["shareID"] != got[1]["shareID"]
    for r in got:
        assert r["consumedCapacity"] == {"cores": "50", "memory": "40000Mi"}
    # what the two consume together is at most the GPU as its slice publishes it
    published = node_gpu0(cluster)["capacity"]
    for name in (dra.CAPACITY_CORES, dra.CAPACITY_MEMORY):
        used = sum((Quantity.parse(r["consumedCapacity"][name]) for r in got), Quantity(0))
        assert not Quantity.parse(published[name]["value"]) < used, name
    # prepared by the node's plugin with HAMi-core limits that together stay within the GPU
    memory, sm = 0, 0
    for pod, claim in zip(("a", "b"), claims, strict=True):
        bound = wait_until(
            lambda pod=pod: (p := cluster.pod(ns, pod)).get("status", {}).get("resourceClaimStatuses") and p,
            timeout=30,
            what=f"the resourceClaimStatuses of {pod}",
        )
        node.kubelet.prepare(bound)
        spec = json.loads((node.cdi / f"topoalloc.io-claim_{claim['metadata']['uid']}.json").read_text())
        env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
        assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "40000m" and env["CUDA_DEVICE_SM_LIMIT"] == "50"
        memory += int(env["CUDA_DEVICE_MEMORY_LIMIT_0"].removesuffix("m"))
        sm += int(env["CUDA_DEVICE_SM_LIMIT"])
        node.kubelet.unprepare(bound)
    assert memory * 1024**2 <= Quantity.parse(published["memory"]["value"]).value() and sm <= 100
    cluster.create_pod(ns, claim_pod("c", "tenth", ns))
    notes = wait_until(
        lambda: event_notes(cluster, ns, "DRAAllocationFailed"), timeout=60, what="the third's Event"
    )
    assert "10% compute" in notes[0], notes
    assert gates(cluster, ns, "c") == [dra.SCHEDULING_GATE]
    assert "allocation" not in (claim_of(cluster, ns, "c").get("status") or {})
    cleanup(cluster, ns)


def node_gpu0(cluster: ClusterEnv) -> JSON:
    devices = [d for s in node_slices(cluster, NODE) for d in s["spec"]["devices"]]
    return next(d for d in devices if d["name"] == "gpu-0")


@pytest.mark.k8s(min="1.36")
def test_topoalloc_writes_shares_as_kube_scheduler_does(cluster: ClusterEnv, node: DraNode, ns: str) -> None:
    """kube-scheduler's own allocation of an opted-out share and of an opted-out whole GPU on the
    sharable node, and topoalloc's of the same claims: the same keys, names and amounts."""
    create_template(cluster, share_template("ks-share", ns, "25", "10Gi", annotations=OPT_OUT))
    create_template(cluster, share_template("ta-share", ns, "25", "10Gi"))
    create_template(cluster, gpu_template("ks-whole", 1, ns, annotations=OPT_OUT))
    create_template(cluster, gpu_template("ta-whole", 1, ns))
    found = {}
    for pod in ("ks-share", "ta-share", "ks-whole", "ta-whole"):
        cluster.create_pod(ns, claim_pod(pod, pod, ns, node=NODE))
        cluster.wait_bound(ns, pod)
        found[pod] = result_of(allocated_claim(cluster, ns, pod))
    print("kube-scheduler's share:", found["ks-share"])
    print("kube-scheduler's whole GPU:", found["ks-whole"])
    print("topoalloc's share:", found["ta-share"])
    print("topoalloc's whole GPU:", found["ta-whole"])
    for kind in ("share", "whole"):
        ks, ta = found[f"ks-{kind}"], found[f"ta-{kind}"]
        assert sorted(ks) == sorted(ta), kind
        assert ks["consumedCapacity"] == ta["consumedCapacity"], kind
        assert len(ks["shareID"]) == len(ta["shareID"]) == 36
    assert found["ks-share"]["consumedCapacity"] == {"cores": "25", "memory": "10Gi"}
    cleanup(cluster, ns)


@pytest.mark.k8s(max="1.35")
def test_a_share_asked_of_a_whole_only_node_is_refused_saying_so(
    cluster: ClusterEnv, node: DraNode, ns: str
) -> None:
    """1.35 drops consumable capacity on write, after admission (measured: the template comes back
    without capacity.requests and its claim would take a whole GPU): the claims webhook refuses a
    template or claim asking a share while the cluster's GPUs are whole only."""
    for kind, path, obj in (
        ("template", TEMPLATES, share_template("half", ns, "50", "10Gi")),
        ("claim", CLAIMS, share_claim("half", ns)),
    ):
        with pytest.raises(ApiStatus) as refused:
            cluster.cp.admin.post(path.format(ns=ns), obj)
        assert refused.value.status == 400, kind
        assert "whole only" in str(refused.value.body) and "allowMultipleAllocations" in str(
            refused.value.body
        )
    # the same template asking a whole GPU is taken, and its claim allocated as usual
    create_template(cluster, gpu_template("whole", 1, ns))
    cluster.create_pod(ns, claim_pod("p", "whole", ns, node=NODE))
    cluster.wait_bound(ns, "p")
    assert "consumedCapacity" not in result_of(allocated_claim(cluster, ns, "p"))
    cleanup(cluster, ns)


def share_claim(name: str, ns: str) -> JSON:
    template = share_template(name, ns, "50", "10Gi")
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": template["spec"]["spec"],
    }
