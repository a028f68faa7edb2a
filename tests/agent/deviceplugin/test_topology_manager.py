"""kubelet's Topology Manager and the allocator agree (issue 32).

The real agent reads kubelet's configuration file (Topology Manager policy and scope, static CPU
manager, reserved CPUs) and publishes it on the Node; the allocator's core, fed the Node and the
Device from the API as its watch cache would be, places pods; the stand-in kubelet, with kubelet's
hint merging and static CPU manager (tests/support/topology_manager.py, the oracle), admits them
through the agent's device plugins. Under best-effort, restricted and single-numa-node, with both
scopes, every pod the allocator places is admitted with exactly its annotated devices, and a pod
the policy cannot admit is not placed. Without the policy labels the same sequence has pods refused
at admission (the control that shows the labels matter).
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import yaml

from agent.deviceplugin.inventory import base_of
from agent.discovery.sysfs import parse_list
from allocator.core.cluster.state import ClusterState
from allocator.core.devices.numa_policy import TOPOLOGY_MANAGER
from allocator.core.reasons import Rejection
from allocator.core.request.parse import pod_request
from apis import keys
from apis.kubelet_policy import CPU_MANAGER_POLICY, LABELS, NUMA_CPUS, NUMA_TOPOLOGY_POLICY
from tests.agent.deviceplugin.rig import NODE, Rig, pod_doc
from tests.agent.support import FIXTURES, wait_for
from tests.support import topology_manager as tm
from tests.support.kubelet import AdmissionError

SYS = FIXTURES / "dgx-h100" / "sys" / "devices" / "system" / "node"
RESERVED = "0-1,112-113"  # reservedSystemCPUs: two cores of NUMA node 0


def _cpus() -> dict[int, list[int]]:
    return {n: parse_list((SYS / f"node{n}" / "cpulist").read_text()) or [] for n in (0, 1)}


def _start(make_rig, policy: str, scope: str) -> Rig:
    rig = make_rig("dgx-h100")
    rig.kubelet_config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "cpuManagerPolicy": "static",
                "reservedSystemCPUs": RESERVED,
                "topologyManagerPolicy": policy,
                "topologyManagerScope": scope,
            }
        )
    )
    kubelet = rig.start_kubelet()
    kubelet.topology_policy, kubelet.topology_scope = policy, scope
    kubelet.cpu_manager = tm.StaticCpus(_cpus(), reserved=set(parse_list(RESERVED) or []))
    rig.start_agent()
    return rig


def _node(rig: Rig) -> dict[str, Any]:
    return rig.server.get("nodes", NODE)


def test_the_agent_publishes_kubelets_policies(make_rig) -> None:
    rig = _start(make_rig, "single-numa-node", "pod")
    assert wait_for(lambda: NUMA_TOPOLOGY_POLICY in _node(rig)["metadata"].get("labels", {}), 10)
    labels = _node(rig)["metadata"]["labels"]
    assert {k: labels.get(k) for k in LABELS} == {
        NUMA_TOPOLOGY_POLICY: "SingleNUMANode",
        "topoalloc.io/topology-manager-scope": "pod",
        CPU_MANAGER_POLICY: "static",
        NUMA_CPUS: "0.112.108_1.112.112",  # 4 reserved CPUs on NUMA node 0
    }
    assert rig.agent is not None and rig.agent.health_state()["kubelet"]["topologyManagerPolicy"] == (
        "single-numa-node"
    )


SHAPES: list[tuple[str, dict[str, str]]] = [
    ("gpu1", {"nvidia.com/gpu": "1"}),
    ("gpu2", {"nvidia.com/gpu": "2"}),
    ("gpu4", {"nvidia.com/gpu": "4"}),
    ("gpu8", {"nvidia.com/gpu": "8"}),
    ("share50", {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}),
    ("share25", {"koordinator.sh/gpu-core": "25", "koordinator.sh/gpu-memory-ratio": "25"}),
    ("gpu1-nic", {"nvidia.com/gpu": "1", "koordinator.sh/rdma": "1"}),
    # Koordinator's own GPU resource: a third kubelet resource over the same GPUs
    ("koord100", {"koordinator.sh/gpu": "100"}),
    ("koord30", {"koordinator.sh/gpu": "30"}),
]
CPUS = (0, 4, 24, 48, 90)  # exclusive CPUs (0: a Burstable pod, no CPU pinned)


def _pod(rng: random.Random, i: int) -> dict[str, Any]:
    shape, devices = rng.choice(SHAPES)
    cpus = rng.choice(CPUS)
    limits = dict(devices)
    if cpus:
        limits.update({"cpu": str(cpus), "memory": "8Gi"})  # Guaranteed: requests = limits
    return pod_doc(f"p{i:03d}-{shape}-c{cpus}", {"main": limits}, None)


def _place_and_admit(rig: Rig, rng: random.Random, rounds: int, *, honour: bool) -> dict[str, int]:
    """Place `rounds` pods with the allocator's core and admit each; returns the outcome counts."""
    assert rig.kubelet is not None
    cluster = ClusterState()
    node = _node(rig)
    # kubelet's allocatable: every CPU but the reserved ones (kube-scheduler counts requests on it)
    node["status"]["allocatable"] = {"cpu": "220", "memory": "2Ti", "pods": "110"}
    if not honour:  # the control: the allocator blind to kubelet's policy
        node["metadata"]["labels"] = {k: v for k, v in node["metadata"]["labels"].items() if k not in LABELS}
    cluster.upsert_node(node)
    cluster.set_device(rig.server.get("devices", NODE))
    running: list[str] = []
    seen = {"placed": 0, "admitted": 0, "refused at admission": 0, "not placed (policy)": 0, "not placed": 0}
    for i in range(rounds):
        if running and rng.random() < 0.5:  # a departure
            gone = running.pop(rng.randrange(len(running)))
            pod = rig.server.get("pods", gone, "default")
            pod["status"]["phase"] = "Succeeded"
            rig.server.put(pod)
            rig.kubelet.release("default", gone)
            cluster.unassign(f"default/{gone}")
        doc = _pod(rng, i)
        req = pod_request(doc)
        if cluster.resources_fit(NODE, req) is not None:  # kube-scheduler's NodeResourcesFit
            seen["not placed"] += 1
            continue
        got = cluster.allocate(req, NODE)
        if isinstance(got, Rejection):
            seen["not placed (policy)" if got.code == TOPOLOGY_MANAGER else "not placed"] += 1
            continue
        seen["placed"] += 1
        doc["metadata"]["annotations"] = {keys.DEVICE_ALLOCATED: got.to_json()}
        pod = rig.server.put(doc)
        want = _kubelet_ids(rig, got.devices.to_json(), doc)
        try:
            granted = rig.kubelet.admit(pod)["main"]
        except AdmissionError as exc:
            seen["refused at admission"] += 1
            if honour:
                raise AssertionError(
                    f"{doc['metadata']['name']}: placed by the allocator, refused: {exc}"
                ) from None
            pod["status"]["phase"] = "Failed"
            rig.server.put(pod)
            continue
        seen["admitted"] += 1
        assert {r: _devices(r, g.ids) for r, g in granted.items()} == want, doc["metadata"]["name"]
        pod["status"]["phase"] = "Running"
        rig.server.put(pod)
        cluster.assign_pod(rig.server.get("pods", doc["metadata"]["name"], "default"))
        running.append(doc["metadata"]["name"])
    return seen


def _devices(resource: str, ids: list[str]) -> tuple[list[str], int]:
    """The GPUs or NICs kubelet IDs stand for, and how many IDs."""
    return sorted({base_of(resource, i) for i in ids}), len(ids)


def _kubelet_ids(rig: Rig, annotation: str, doc: dict[str, Any]) -> dict[str, tuple[list[str], int]]:
    """What the annotation gives the pod's one container, per resource, as `_devices` says it."""
    limits = doc["spec"]["containers"][0]["resources"]["limits"]
    entries = json.loads(annotation)
    gpus = sorted(rig.uuid(e["minor"]) for e in entries.get("gpu", []))
    out: dict[str, tuple[list[str], int]] = {}
    for resource in ("nvidia.com/gpu", "koordinator.sh/gpu-core", "koordinator.sh/gpu"):
        if resource in limits:
            out[resource] = (gpus, int(limits[resource]))
    if "koordinator.sh/rdma" in limits:
        out["koordinator.sh/rdma"] = (
            sorted(e["id"] for e in entries["rdma"]),
            int(limits["koordinator.sh/rdma"]),
        )
    return out


@pytest.mark.parametrize("scope", ["container", "pod"])
@pytest.mark.parametrize("policy", ["best-effort", "restricted", "single-numa-node"])
def test_placed_pods_are_admitted_with_exactly_their_devices(make_rig, policy: str, scope: str) -> None:
    rig = _start(make_rig, policy, scope)
    assert wait_for(lambda: NUMA_TOPOLOGY_POLICY in _node(rig)["metadata"].get("labels", {}), 10)
    seen = _place_and_admit(rig, random.Random(f"{policy}/{scope}"), 60, honour=True)
    assert seen["placed"] == seen["admitted"] >= 25, seen
    if policy == "single-numa-node":
        assert seen["not placed (policy)"] >= 1, seen  # 8 GPUs never fit one NUMA node here


@pytest.mark.parametrize("policy", ["best-effort", "single-numa-node"])
def test_an_allocator_blind_to_the_policy_has_pods_refused(make_rig, policy: str) -> None:
    """The control: the same pods, the allocator not told kubelet's policy (no labels): kubelet's
    Topology Manager puts some of them elsewhere than the annotation says, and they are refused."""
    rig = _start(make_rig, policy, "container")
    assert wait_for(lambda: NUMA_TOPOLOGY_POLICY in _node(rig)["metadata"].get("labels", {}), 10)
    seen = _place_and_admit(rig, random.Random(f"{policy}/container"), 60, honour=False)
    assert seen["refused at admission"] >= 3, seen
