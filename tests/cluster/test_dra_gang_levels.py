"""A gang of claims on topology levels on the real control plane: three DGX H100 nodes in dra mode
(two in rack r1, one in r2), a 2x8 gang of claims whose members ask for a required rack. While r1
has one free node the gang waits, no claim allocated, each member saying why; once r1 has room the
two members land there, both bound, and the gang's Event names both nodes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from apis import dra, keys
from tests.cluster.dra import DraNode, running_dra_nodes, start_dra_node
from tests.cluster.dra_claims import (
    allocated_claim,
    claim_of,
    claim_pod,
    cleanup,
    create_template,
    event_notes,
    gates,
    gpu_template,
    node_of,
)
from tests.cluster.gang_sources import SCHEDULER_PLUGINS, GangSource, gang_events, gang_sources
from tests.cluster.harness import RACK, ClusterEnv
from tests.support.controlplane import wait_until

RACKS = {"rk-a1": "r1", "rk-a2": "r1", "rk-b1": "r2"}


@pytest.fixture(scope="module")
def nodes(cluster: ClusterEnv) -> Iterator[dict[str, DraNode]]:
    started = {n: start_dra_node(cluster, n, labels={RACK: r}) for n, r in RACKS.items()}
    with running_dra_nodes(cluster, started) as running:
        yield running


@gang_sources(SCHEDULER_PLUGINS)
def test_a_2x8_gang_of_claims_with_a_required_rack_lands_in_one_rack_or_waits(
    cluster: ClusterEnv, nodes: dict[str, DraNode], ns: str, gang_source: GangSource
) -> None:
    create_template(cluster, gpu_template("eight", 8, ns))
    cluster.create_pod(ns, claim_pod("filler", "eight", ns, node="rk-a2"))  # r1 keeps one free node
    assert node_of(allocated_claim(cluster, ns, "filler")) == "rk-a2"
    cluster.wait_bound(ns, "filler")
    gang_source.create(cluster.cp, ns, "g", 2)
    for name in ("g-0", "g-1"):
        pod = gang_source.join(claim_pod(name, "eight", ns), "g")
        pod["metadata"]["annotations"] = {keys.REQUIRED_TOPOLOGY: "rack"}
        cluster.create_pod(ns, pod)
    # rk-a1 and rk-b1 are free, in two racks: the gang waits, no claim allocated
    wait_until(
        lambda: len([n for n in event_notes(cluster, ns, "DRAAllocationFailed") if "gang" in n]) >= 2,
        timeout=60,
        what="the members' Events",
    )
    notes = [n for n in event_notes(cluster, ns, "DRAAllocationFailed") if "gang" in n]
    assert all("required rack (topoalloc.io/rack)" in n for n in notes), notes
    for name in ("g-0", "g-1"):
        assert dra.SCHEDULING_GATE in gates(cluster, ns, name)
        assert not claim_of(cluster, ns, name).get("status", {}).get("allocation")
    # r1 gets room: both members go there
    cluster.cp.admin.delete(f"/api/v1/namespaces/{ns}/pods/filler", gracePeriodSeconds=0)
    bound = {n: cluster.wait_bound(ns, n, timeout=90)["spec"]["nodeName"] for n in ("g-0", "g-1")}
    assert sorted(bound.values()) == ["rk-a1", "rk-a2"]
    for name in ("g-0", "g-1"):
        assert node_of(allocated_claim(cluster, ns, name)) == bound[name]
    planned = wait_until(
        lambda: gang_events(cluster.events(ns), gang_source.kind, "g", "GangPlanned"),
        timeout=30,
        what="the gang's GangPlanned Event",
    )
    assert any("2 member(s) on rk-a1, rk-a2" in e["message"] for e in planned), planned
    cleanup(cluster, ns)
