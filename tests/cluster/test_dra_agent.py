"""The node side of DRA on the real control plane: the agent process in dra mode (fixture mode, its
node-bound identity) publishes ResourceSlices the real API server accepts and keeps them up to date
on a health change, labels its Node; kube-scheduler's own allocator allocates every example claim
template against them (the claims made from the templates by kube-controller-manager), the pod
binds, and the stand-in DRA kubelet prepares it through the agent's DRA plugin and gets exactly the
allocated devices' CDI IDs, also from an agent process started again on the same checkpoint."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.dra.slice_publisher import WHOLE_GPUS_REASON
from allocator.core.claims.taints import DEVICE_TAINTED
from apis import dra
from apis.dra_taints import NO_SCHEDULE, UNHEALTHY_KEY
from tests.cluster.dra import CLAIMS, DraNode, restart_agent, start_dra_node, stop_dra_node, wait_slices
from tests.cluster.dra_claims import (
    OPT_OUT,
    allocated_claim,
    claim_of,
    claim_pod,
    create_template,
    event_notes,
    gates,
    gpu_template,
    results,
)
from tests.cluster.harness import DEVICES, ClusterEnv
from tests.support.controlplane import REPO, wait_until
from tests.support.kube_releases import KubeRelease

NODE = "dra-dgx"
EXAMPLES = sorted((REPO / "examples" / "dra").glob("*.yaml"))


@pytest.fixture(scope="module")
def node(cluster: ClusterEnv) -> Iterator[DraNode]:
    dra_node = start_dra_node(cluster, NODE)
    try:
        wait_slices(cluster, dra_node)
        dra_node.kubelet.wait_registered(dra.DRIVER, timeout=60)
        yield dra_node
    finally:
        stop_dra_node(cluster, dra_node)


def attr(device: dict[str, Any], name: str) -> Any:
    (value,) = device["attributes"][name].values()
    return value


def pool(cluster: ClusterEnv, node: DraNode) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in wait_slices(cluster, node) for d in s["spec"]["devices"]}


def test_slices_accepted_as_written_and_the_node_labelled(
    cluster: ClusterEnv, node: DraNode, release: KubeRelease
) -> None:
    slices = wait_slices(cluster, node)
    assert {(s["spec"]["pool"]["name"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices} == {
        (NODE, len(slices))
    }
    assert len({s["spec"]["pool"]["generation"] for s in slices}) == 1
    everything = pool(cluster, node)
    # 1.36 keeps the 4 NICs whose ports are down, tainted; 1.35 has them left out
    tainted = sorted(n for n, d in everything.items() if d.get("taints"))
    assert tainted == (["rdma-1", "rdma-2", "rdma-7", "rdma-8"] if release.minor_int >= 36 else [])
    devices = {n: d for n, d in everything.items() if n not in tainted}
    # 8 GPUs, the 8 NICs whose ports are up (4 are down on this machine) and their 4 VFs each
    assert sum(1 for n in devices if n.startswith("gpu-")) == 8
    assert sum(1 for n in devices if n.startswith("rdma-") and "-vf-" not in n) == 8
    assert sum(1 for n in devices if "-vf-" in n) == 32
    gpu = devices["gpu-0"]  # the server kept every attribute and capacity as written
    assert attr(gpu, dra.PCIE_ROOT) == "pci0000:15" and attr(gpu, dra.NUMA_NODE) == 0
    assert attr(gpu, "pcieSwitch") == attr(devices["rdma-0"], "pcieSwitch") == "0000:16:00.0"
    assert gpu["capacity"]["memory"]["value"] == "81559Mi"
    owner = slices[0]["metadata"]["ownerReferences"][0]
    the_node = cluster.cp.admin.get(f"/api/v1/nodes/{NODE}")
    assert (owner["kind"], owner["uid"]) == ("Node", the_node["metadata"]["uid"])
    assert the_node["metadata"]["labels"][dra.MODE_LABEL] == "dra"
    assert not any(k.startswith("koordinator.sh/") for k in the_node["status"]["allocatable"])
    assert cluster.cp.admin.get(f"{DEVICES}/{NODE}")["spec"]["devices"]  # the Device is still there


def test_gpus_are_sharable_where_the_server_keeps_it_else_whole_and_the_node_says_so(
    cluster: ClusterEnv, node: DraNode, release: KubeRelease
) -> None:
    devices = pool(cluster, node)
    gpus = [d for n, d in devices.items() if n.startswith("gpu-")]
    assert len(gpus) == 8

    def told() -> list[dict[str, Any]]:
        return [
            e
            for e in cluster.events("default")
            if e.get("reason") == WHOLE_GPUS_REASON and e["involvedObject"]["name"] == NODE
        ]

    if release.minor_int >= 36:  # kept exactly as the agent wrote it: sharable, the whole by default
        for gpu in gpus:
            assert gpu[dra.ALLOW_MULTIPLE] is True
            assert gpu["capacity"] == dra.gpu_capacity("81559Mi", sharable=True)
        assert not told()
    else:  # the server drops consumable capacity: whole GPUs, and a Warning Event on the Node
        for gpu in gpus:
            assert dra.ALLOW_MULTIPLE not in gpu
            assert gpu["capacity"] == {dra.CAPACITY_MEMORY: {"value": "81559Mi"}}
        event = wait_until(told, timeout=30, what="the agent's Event: GPUs whole only")[0]
        assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Node"
        assert "published whole only" in event["message"] and "1.35" in event["message"]
    for name, dev in devices.items():  # NICs and VFs are whole everywhere
        if not name.startswith("gpu-"):
            assert dra.ALLOW_MULTIPLE not in dev


def test_slices_are_not_rewritten_while_nothing_changes(cluster: ClusterEnv, node: DraNode) -> None:
    before = [(s["metadata"]["name"], s["metadata"]["resourceVersion"]) for s in wait_slices(cluster, node)]
    time.sleep(7)  # three resyncs of the agent (every 2 s): what passes is the point
    after = [(s["metadata"]["name"], s["metadata"]["resourceVersion"]) for s in wait_slices(cluster, node)]
    assert after == before


@pytest.mark.k8s(max="1.35")
def test_a_nic_going_down_leaves_the_slices_and_comes_back(cluster: ClusterEnv, node: DraNode) -> None:
    generation = wait_slices(cluster, node)[0]["spec"]["pool"]["generation"]
    state = node.fixture / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "state"
    up = state.read_text()
    state.write_text("1: DOWN\n")
    try:
        down = wait_slices(cluster, node, lambda s: s[0]["spec"]["pool"]["generation"] > generation)
        names = {d["name"] for s in down for d in s["spec"]["devices"]}
        assert "rdma-0" not in names and not any(n.startswith("rdma-0-vf-") for n in names)
        assert "gpu-0" in names
        assert {s["spec"]["pool"]["generation"] for s in down} == {generation + 1}
        assert not any(d.get("taints") for s in down for d in s["spec"]["devices"])  # dropped on 1.35
    finally:
        state.write_text(up)
    back = wait_slices(
        cluster, node, lambda s: "rdma-0" in {d["name"] for x in s for d in x["spec"]["devices"]}
    )
    assert back[0]["spec"]["pool"]["generation"] == generation + 2


@pytest.mark.k8s(min="1.36")
def test_a_nic_going_down_stays_in_the_slices_tainted_and_comes_back(
    cluster: ClusterEnv, node: DraNode
) -> None:
    generation = wait_slices(cluster, node)[0]["spec"]["pool"]["generation"]
    state = node.fixture / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "state"
    up = state.read_text()
    state.write_text("1: DOWN\n")
    try:
        down = wait_slices(cluster, node, lambda s: s[0]["spec"]["pool"]["generation"] > generation)
        devices = {d["name"]: d for s in down for d in s["spec"]["devices"]}
        sick = ["rdma-0", *(n for n in devices if n.startswith("rdma-0-vf-"))]
        assert len(sick) == 5  # the NIC and its 4 VFs, still published, tainted as the agent wrote them
        for name in sick:
            (taint,) = devices[name]["taints"]
            assert (taint["key"], taint["effect"]) == (UNHEALTHY_KEY, NO_SCHEDULE) and taint["value"]
            assert taint["timeAdded"]
        assert not devices["gpu-0"].get("taints") and not devices["rdma-3"].get("taints")
        assert devices["rdma-1"]["taints"][0]["value"] == "PortDown"  # down from the start
        assert {s["spec"]["pool"]["generation"] for s in down} == {generation + 1}
    finally:
        state.write_text(up)
    back = wait_slices(
        cluster,
        node,
        lambda s: not any(d.get("taints") for x in s for d in x["spec"]["devices"] if d["name"] == "rdma-0"),
    )
    assert back[0]["spec"]["pool"]["generation"] == generation + 2


def test_examples_are_accepted_by_the_api_server(cluster: ClusterEnv, ns: str) -> None:
    done = cluster.cp.kubectl(
        "create", "--dry-run=server", "-n", ns, *[a for p in EXAMPLES for a in ("-f", str(p))]
    )
    assert done.stdout.count("created (server dry run)") == 2 * len(EXAMPLES), done.stdout
    classes = {
        c["metadata"]["name"] for c in cluster.cp.admin.get("/apis/resource.k8s.io/v1/deviceclasses")["items"]
    }
    assert set(dra.CLASSES) <= classes


def _example(path: Path, ns: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The example's template (left to kube-scheduler's own allocator) and pod (pinned to the node)."""
    template, pod = (copy.deepcopy(d) for d in yaml.safe_load_all(path.read_text()))
    template["spec"].setdefault("metadata", {}).setdefault("annotations", {})[dra.ALLOCATOR_ANNOTATION] = (
        dra.ALLOCATOR_KUBE_SCHEDULER
    )
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    for doc in (template, pod):
        doc["metadata"]["namespace"] = ns
    return template, pod


def _run(cluster: ClusterEnv, ns: str, example: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The example's template and pod created; once bound: the pod as kubelet would see it (its
    claim named in its status by kube-controller-manager) and its claim (allocated and reserved
    for it by kube-scheduler)."""
    template, pod = _example(example, ns)
    cluster.cp.admin.post(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates", template)
    cluster.create_pod(ns, pod)
    name = pod["metadata"]["name"]
    assert cluster.wait_bound(ns, name)["spec"]["nodeName"] == NODE
    bound = wait_until(
        lambda: (p := cluster.pod(ns, name)).get("status", {}).get("resourceClaimStatuses") and p,
        timeout=30,
        what="the pod's resourceClaimStatuses",
    )
    (claim,) = _claims(cluster, ns)
    return bound, claim


def _claims(cluster: ClusterEnv, ns: str) -> list[dict[str, Any]]:
    return list(cluster.cp.admin.get(CLAIMS.format(ns=ns))["items"])


def _cdi_ids(claim: dict[str, Any]) -> list[str]:
    uid = claim["metadata"]["uid"]
    return [
        f"topoalloc.io/claim={uid}-{r['device']}" for r in claim["status"]["allocation"]["devices"]["results"]
    ]


def _check_constraints(claim: dict[str, Any], devices: dict[str, dict[str, Any]]) -> None:
    """Each matchAttribute of the claim holds among the devices kube-scheduler chose."""
    results = claim["status"]["allocation"]["devices"]["results"]
    for constraint in claim["spec"]["devices"].get("constraints") or []:
        name = constraint["matchAttribute"].removeprefix(f"{dra.DRIVER}/")
        values = {attr(devices[r["device"]], name) for r in results if r["request"] in constraint["requests"]}
        assert len(values) == 1, (constraint, results)


def _done(cluster: ClusterEnv, ns: str) -> None:
    cluster.delete_pods(ns)
    wait_until(lambda: not _claims(cluster, ns), timeout=60, what="the pod's claim deleted with it")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_kube_scheduler_allocates_each_example_and_the_plugin_prepares_it(
    cluster: ClusterEnv, node: DraNode, ns: str, example: Path, release: KubeRelease
) -> None:
    bound, claim = _run(cluster, ns, example)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {(r["driver"], r["pool"]) for r in results} == {(dra.DRIVER, NODE)}
    for r in results:  # a sharable GPU asked for nothing: kube-scheduler gives a share of all of it
        if r["device"].startswith("gpu-") and release.minor_int >= 36:
            assert r["shareID"] and r["consumedCapacity"] == {
                dra.CAPACITY_MEMORY: "81559Mi",
                dra.CAPACITY_CORES: "100",
            }
        else:
            assert "shareID" not in r and "consumedCapacity" not in r
    _check_constraints(claim, pool(cluster, node))
    got = node.kubelet.prepare(bound)
    uid = claim["metadata"]["uid"]
    assert got == {bound["spec"]["containers"][0]["name"]: _cdi_ids(claim)}
    spec = yaml.safe_load((node.cdi / f"topoalloc.io-claim_{uid}.json").read_text())
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-{r['device']}" for r in results]
    node.kubelet.unprepare(bound)
    assert not (node.cdi / f"topoalloc.io-claim_{uid}.json").exists()
    _done(cluster, ns)


def test_an_agent_started_again_keeps_the_prepared_claim(cluster: ClusterEnv, node: DraNode, ns: str) -> None:
    bound, claim = _run(cluster, ns, REPO / "examples" / "dra" / "nvlink-pair.yaml")
    first = node.kubelet.prepare(bound)
    assert first == {"trainer": _cdi_ids(claim)}
    registered = len(node.kubelet.registrations)
    restart_agent(cluster, node, 1)  # a new process on the same checkpoint folder
    node.kubelet.wait_registered(dra.DRIVER, timeout=60, count=registered + 1)
    node.kubelet.cache.clear()  # kubelet asks again, as after its own restart
    assert node.kubelet.prepare(bound) == first
    assert [c[0] for c in node.kubelet.calls[-2:]] == ["NodePrepareResources", "NodePrepareResources"]
    node.kubelet.unprepare(bound)  # what the first process prepared, the second unprepares
    assert not list(node.cdi.glob("*.json"))
    _done(cluster, ns)


def _share_pod(cluster: ClusterEnv, ns: str, name: str, memory: str, cores: str) -> None:
    """A pod on the node with one opt-out claim for a share of gpu-5 (kube-scheduler allocates it)."""
    template = gpu_template(name, 1, ns, annotations=OPT_OUT)
    request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    request["selectors"] = [{"cel": {"expression": f'device.attributes["{dra.DRIVER}"].minor == 5'}}]
    request["capacity"] = {"requests": {dra.CAPACITY_MEMORY: memory, dra.CAPACITY_CORES: cores}}
    create_template(cluster, template)
    cluster.create_pod(ns, claim_pod(name, name, ns, node=NODE))


@pytest.mark.k8s(min="1.36")
def test_two_shares_kube_scheduler_put_on_one_gpu_are_prepared_with_their_limits(
    cluster: ClusterEnv, node: DraNode, ns: str
) -> None:
    _share_pod(cluster, ns, "share-a", "10Gi", "30")
    _share_pod(cluster, ns, "share-b", "20Gi", "50")
    claims = {name: allocated_claim(cluster, ns, name) for name in ("share-a", "share-b")}
    found = {name: claim["status"]["allocation"]["devices"]["results"] for name, claim in claims.items()}
    (a,), (b,) = found["share-a"], found["share-b"]
    assert a["device"] == b["device"] == "gpu-5" and a["shareID"] and a["shareID"] != b["shareID"]
    # what kube-scheduler writes: the slice's (unqualified) capacity names, as requested
    assert a["consumedCapacity"] == {dra.CAPACITY_MEMORY: "10Gi", dra.CAPACITY_CORES: "30"}
    assert b["consumedCapacity"] == {dra.CAPACITY_MEMORY: "20Gi", dra.CAPACITY_CORES: "50"}
    limits, pods = {}, []
    for name, claim in claims.items():  # both prepared at once: one GPU, two claims
        bound = wait_until(
            lambda n=name: (p := cluster.pod(ns, n)).get("status", {}).get("resourceClaimStatuses") and p,
            timeout=30,
            what=f"the resourceClaimStatuses of {name}",
        )
        assert node.kubelet.prepare(bound) == {"main": _cdi_ids(claim)}
        pods.append(bound)
        spec = yaml.safe_load((node.cdi / f"topoalloc.io-claim_{claim['metadata']['uid']}.json").read_text())
        env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
        limits[name] = (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"])
    assert limits == {"share-a": ("10240m", "30"), "share-b": ("20480m", "50")}
    for bound in pods:
        node.kubelet.unprepare(bound)
    _done(cluster, ns)


def _nic_claim_pod(cluster: ClusterEnv, ns: str, name: str, count: int, *, opt_out: bool = False) -> None:
    """A pod on the node with one claim (from its own template) for `count` whole NICs."""
    template = gpu_template(name, count, ns, annotations=OPT_OUT if opt_out else None)
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = dra.RDMA_CLASS
    create_template(cluster, template)
    cluster.create_pod(ns, claim_pod(name, name, ns, node=NODE))


def _port(node: DraNode, ibdev: str) -> Path:
    return node.fixture / "sys" / "class" / "infiniband" / ibdev / "ports" / "1" / "state"


@pytest.mark.k8s(min="1.36")
def test_a_claims_device_turned_unhealthy_tells_the_claim_and_new_claims_avoid_it(
    cluster: ClusterEnv, node: DraNode, ns: str
) -> None:
    _nic_claim_pod(cluster, ns, "holder", 1)
    ((_, held),) = results(allocated_claim(cluster, ns, "holder"))
    devices = pool(cluster, node)
    healthy = sorted(
        n for n, d in devices.items() if n.startswith("rdma-") and "-vf-" not in n and not d.get("taints")
    )
    spare = next(n for n in healthy if n != held)  # a free NIC goes down too
    ports = [_port(node, attr(devices[n], "ibdev")) for n in (held, spare)]
    ups = [p.read_text() for p in ports]
    try:
        for p in ports:
            p.write_text("1: DOWN\n")
        (note,) = wait_until(
            lambda: event_notes(cluster, ns, DEVICE_TAINTED), timeout=60, what="the holder claim's Event"
        )
        (event,) = [e for e in cluster.events(ns) if e.get("reason") == DEVICE_TAINTED]
        claim = claim_of(cluster, ns, "holder")
        assert (event["involvedObject"]["kind"], event["involvedObject"]["uid"]) == (
            "ResourceClaim",
            claim["metadata"]["uid"],
        )
        assert note.startswith(f"device {held} of node {NODE} is tainted {UNHEALTHY_KEY}=PortDown:NoSchedule")
        free = len(healthy) - 2  # untainted and not held
        # topoalloc waits rather than hand out a tainted NIC, and says so
        _nic_claim_pod(cluster, ns, "too-many", free + 1)
        wait_until(lambda: event_notes(cluster, ns, "DRAAllocationFailed"), timeout=60, what="the refusal")
        assert gates(cluster, ns, "too-many")
        assert not claim_of(cluster, ns, "too-many").get("status", {}).get("allocation")
        # kube-scheduler's own allocator does too: the taint is in the slice for everyone
        _nic_claim_pod(cluster, ns, "too-many-ks", free + 1, opt_out=True)
        wait_until(
            lambda: any(
                c["type"] == "PodScheduled" and c["status"] == "False"
                for c in cluster.pod(ns, "too-many-ks").get("status", {}).get("conditions") or []
            ),
            timeout=60,
            what="kube-scheduler refusing the pod",
        )
        assert not claim_of(cluster, ns, "too-many-ks").get("status", {}).get("allocation")
        _nic_claim_pod(cluster, ns, "fits", free)
        got = {d for _, d in results(allocated_claim(cluster, ns, "fits"))}
        assert len(got) == free and not got & {held, spare}
    finally:
        for p, up in zip(ports, ups, strict=True):
            p.write_text(up)
    wait_slices(
        cluster,
        node,
        lambda s: (
            not any(d.get("taints") for x in s for d in x["spec"]["devices"] if d["name"] in (held, spare))
        ),
    )
    _done(cluster, ns)
