"""Every device counted once, whoever allocates, on the real control plane: topoalloc and
kube-scheduler's own allocator take GPUs from the same ResourceSlices at the same moment (half the
pods opt out of topoalloc), and each sees only the allocations already in its cache. Four DGX-1
nodes in dra mode (their Nodes, Devices and slices registered as the agent writes them; no kubelet:
the claims are the subject), 32 one-GPU claim pods from two ReplicaSets created at once, 20 rounds
on one cluster: each round ends with all 32 pods bound, every claim allocated, no device in two
claims and no pod left gated, and no pod said to be stuck."""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from agent.dra.slices import pool_devices, pool_slices
from apis import dra
from apis.device import Device
from tests.cluster.dra_claims import OPT_OUT, claims, cleanup, create_template, event_notes, gpu_template
from tests.cluster.harness import ClusterEnv
from tests.support.controlplane import REPO, wait_until

FIXTURE = REPO / "hw-fixtures" / "dgx1-v100" / "expected-device.yaml"
DEVICES = "/apis/scheduling.koordinator.sh/v1alpha1/devices"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
NODES = [f"race-{i}" for i in range(4)]  # 8 GPUs each: 32
ROUNDS = int(os.environ.get("TOPOALLOC_RACE_ROUNDS", "20"))
PER_SIDE = 16

JSON = dict[str, Any]


@pytest.fixture(scope="module")
def gpus32(cluster: ClusterEnv) -> Iterator[list[str]]:
    template = yaml.safe_load(FIXTURE.read_text())
    labels = {**(template["metadata"].get("labels") or {}), dra.MODE_LABEL: dra.MODE_DRA}
    for name in NODES:
        node = cluster.cp.create_node(name, capacity={"cpu": "224", "memory": "2015Gi"}, labels=labels)
        device = json.loads(json.dumps(template))
        device["metadata"]["name"] = name
        cluster.cp.admin.post(DEVICES, device)
        devices = pool_devices(Device.from_dict(device), max_vfs=0)
        for s in pool_slices(name, devices, 1, node_uid=node["metadata"]["uid"]):
            cluster.cp.admin.post(SLICES, s)
    try:
        yield NODES
    finally:
        for name in NODES:
            cluster.remove_node(name)


def replica_set(name: str, ns: str, template: str) -> JSON:
    labels = {"app": name}
    res = {"cpu": "1", "memory": "1Gi"}
    pod = {
        "metadata": {"labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {dra.MODE_LABEL: dra.MODE_DRA},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "resources": {"requests": res, "limits": res, "claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": PER_SIDE, "selector": {"matchLabels": labels}, "template": pod},
    }


def settled(cluster: ClusterEnv, ns: str) -> str:
    """ "" once the round is clean: 32 live pods bound and ungated, each claim allocated, no device
    in two claims; else what is not so yet."""
    pods = [p for p in cluster.cp.admin.get(f"/api/v1/namespaces/{ns}/pods")["items"]]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    if len(live) != 2 * PER_SIDE:
        return f"{len(live)} live pods"
    unbound = [p["metadata"]["name"] for p in live if not p["spec"].get("nodeName")]
    if unbound:
        return f"not bound: {unbound}"
    gated = [p["metadata"]["name"] for p in live if p["spec"].get("schedulingGates")]
    if gated:
        return f"gated: {gated}"
    held: Counter[tuple[str, str]] = Counter()
    for c in claims(cluster, ns):
        if c["metadata"].get("deletionTimestamp"):
            continue
        allocation = (c.get("status") or {}).get("allocation")
        if allocation is None:
            return f"claim {c['metadata']['name']} not allocated"
        for r in allocation["devices"]["results"]:
            held[(r["pool"], r["device"])] += 1
    twice = sorted(d for d, n in held.items() if n > 1)
    return f"devices in two claims: {twice}" if twice else ""


def test_a_mixed_burst_never_leaves_a_device_in_two_claims(
    cluster: ClusterEnv, gpus32: list[str], ns: str
) -> None:
    create_template(cluster, gpu_template("ours", 1, ns))
    create_template(cluster, gpu_template("theirs", 1, ns, annotations=OPT_OUT))
    repaired: Counter[str] = Counter()
    last = [""]  # what the last look found not clean yet

    def clean() -> bool:
        last[0] = settled(cluster, ns)
        return not last[0]

    for round_ in range(ROUNDS):
        sets = [replica_set("ours", ns, "ours"), replica_set("theirs", ns, "theirs")]
        threads = [
            threading.Thread(
                target=cluster.cp.admin.post, args=(f"/apis/apps/v1/namespaces/{ns}/replicasets", s)
            )
            for s in sets
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            wait_until(clean, timeout=120, what=f"round {round_} settled", interval=0.5)
        except Exception as exc:
            notes = [
                f"{e.get('reason')} {e['involvedObject'].get('name')}: {e.get('message')}"
                for e in cluster.events(ns)
                if (e.get("reason") or "").startswith("DRA") and e.get("reason") != "DRAAllocated"
            ]
            held = [
                (
                    c["metadata"]["name"],
                    [
                        r["pool"] + "/" + r["device"]
                        for r in ((c.get("status") or {}).get("allocation") or {})
                        .get("devices", {})
                        .get("results", [])
                    ],
                    [r["name"] for r in (c.get("status") or {}).get("reservedFor") or []],
                    c["metadata"].get("deletionTimestamp"),
                    c["metadata"].get("annotations"),
                )
                for c in claims(cluster, ns)
            ]
            raise AssertionError(f"round {round_}: {last[0]}; claims: {held}; events: {notes}") from exc
        stuck = [n for n in event_notes(cluster, ns, "DRADeviceDoubleBooked") if "cannot be moved" in n]
        assert stuck == [], f"round {round_}"
        for reason in ("DRADeviceDoubleBooked", "DRAReallocated"):
            repaired[reason] += len(event_notes(cluster, ns, reason))
        cleanup(cluster, ns)
        cluster.cp.kubectl("delete", "events", "--all", "-n", ns)
    print(f"repairs over {ROUNDS} rounds: {dict(repaired)}")
