"""`NoExecute` for unhealthy devices on the real control plane (1.36, device taints beta and on): an
agent configured with `dra.unhealthyTaintEffect: NoExecute` taints a NIC whose port went down with
that effect, the claim allocated that NIC is told its pods go, and kube-controller-manager's device
taint eviction deletes the bound pod using it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from allocator.core.claims.taints import DEVICE_TAINTED
from apis import dra
from apis.dra_taints import NO_EXECUTE, UNHEALTHY_KEY
from tests.cluster.dra import DraNode, start_dra_node, stop_dra_node, wait_slices
from tests.cluster.dra_claims import (
    allocated_claim,
    claim_pod,
    cleanup,
    create_template,
    event_notes,
    gpu_template,
    results,
)
from tests.cluster.harness import ClusterEnv
from tests.support.controlplane import wait_until

NODE = "dra-noexec"
pytestmark = pytest.mark.k8s(min="1.36")


@pytest.fixture(scope="module")
def node(cluster: ClusterEnv) -> Iterator[DraNode]:
    started = start_dra_node(cluster, NODE, config={"dra": {"unhealthyTaintEffect": NO_EXECUTE}})
    try:
        wait_slices(cluster, started)
        started.kubelet.wait_registered(dra.DRIVER, timeout=60)
        yield started
    finally:
        stop_dra_node(cluster, started)


def _evicted(cluster: ClusterEnv, ns: str, name: str) -> bool:
    """Deleted, or being deleted (no kubelet ends it here)."""
    pods = {p["metadata"]["name"]: p for p in cluster.cp.admin.get(f"/api/v1/namespaces/{ns}/pods")["items"]}
    return name not in pods or bool(pods[name]["metadata"].get("deletionTimestamp"))


def test_a_nic_gone_unhealthy_with_noexecute_evicts_the_pod_using_it(
    cluster: ClusterEnv, node: DraNode, ns: str
) -> None:
    template = gpu_template("nic", 1, ns)
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = dra.RDMA_CLASS
    create_template(cluster, template)
    cluster.create_pod(ns, claim_pod("user", "nic", ns, node=NODE))
    ((_, held),) = results(allocated_claim(cluster, ns, "user"))
    cluster.wait_bound(ns, "user")
    slices = wait_slices(cluster, node)
    device = next(d for s in slices for d in s["spec"]["devices"] if d["name"] == held)
    ibdev = device["attributes"]["ibdev"]["string"]
    port = node.fixture / "sys" / "class" / "infiniband" / ibdev / "ports" / "1" / "state"
    up = port.read_text()
    port.write_text("1: DOWN\n")
    try:
        tainted = wait_slices(
            cluster,
            node,
            lambda s: any(d["name"] == held and d.get("taints") for x in s for d in x["spec"]["devices"]),
        )
        (taint,) = next(d for s in tainted for d in s["spec"]["devices"] if d["name"] == held)["taints"]
        assert (taint["key"], taint["effect"]) == (UNHEALTHY_KEY, NO_EXECUTE)
        (note,) = wait_until(
            lambda: event_notes(cluster, ns, DEVICE_TAINTED), timeout=60, what="the claim's Event"
        )
        assert "evicts the pods using the claim" in note
        wait_until(
            lambda: _evicted(cluster, ns, "user"),
            timeout=90,
            what="the pod evicted by kube-controller-manager",
        )
    finally:
        port.write_text(up)
    cleanup(cluster, ns)
