"""The topology workload through both of topoalloc's paths on one real control plane: the same pods,
created in the same order, once through the extender (kube-scheduler calls the allocator to filter
and bind: deploy/kube-scheduler's configuration) and once in placement mode (deploy/'s webhook
configuration gates each pod at admission, the allocator started with --placement places, pins
and ungates it, and kube-scheduler, configured with nothing of topoalloc, binds it).

Nodes: hw-fixture machines (`--nodes`, default DGX H100, DGX-1 V100 and A100 PCIe with NVLink pairs),
each a Node and its Device CR, with the capacity the agent (no device plugin) would publish; no
kubelets, no agents. Pods (`--pods`, drawn with `--seed`, dropped from the end until the GPUs they
ask are at most `--fill` of the cluster's): shares of a GPU, 1-, 2- and 4-GPU pods, joint GPU+RDMA
pods (one GPU and a NIC; two GPUs with SamePCIe and a VF each) and Koordinator's own
`koordinator.sh/gpu` + RDMA pod with a VF, created one after another as fast as the API server
takes them. Each path runs `--runs` times, alternated.

Per path, read from the bound pods' recorded allocations and the Devices' facts
(simulator/quality.py, the levels the core defines): pods placed (bound, and in placement mode bound
on the node the allocation was made for), multi-GPU pods whose GPUs share one NVLink domain or PCIe
switch and those at the best level their node offers that many GPUs, joint pods whose every GPU has
its NIC behind its own PCIe switch (and those of them whose node could give it), the extender's
refused binds; then how many pods got the same node and devices both ways, and in each path's later
runs as in its first (docs/placement.md, "Topology through both paths, measured").

Run: `.venv/bin/python bench/placement_topology.py [--nodes dgx-h100=6,...] [--pods 100] [--runs 2]
[--release 1.36]`
(needs ../shared/k8s*, /usr/bin/etcd and /usr/bin/kubectl; exits 0 with a note when they are missing).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.publish.device_builder import node_resources  # noqa: E402
from allocator.core.node.inventory import NodeInventory, build_inventory  # noqa: E402
from apis.annotations import parse_device_allocated  # noqa: E402
from apis.device import Device  # noqa: E402
from bench.extender import load_average  # noqa: E402
from bench.scheduler_throughput import (  # noqa: E402
    ALLOCATED,
    BindWatch,
    delete_pods,
    install,
    request_counts,
    scheduler_settings,
    start_replica,
)
from simulator.nodes import fixture_objects, parse_counts  # noqa: E402
from simulator.quality import PCIE, placement_quality  # noqa: E402
from tests.support.cluster_product import AllocatorReplica, lease_holder, make_certs  # noqa: E402
from tests.support.controlplane import HOST, ApiStatus, ControlPlane, missing_parts  # noqa: E402
from tests.support.kube_releases import RELEASES  # noqa: E402
from topoalloc.commands.installer.kustomize import build  # noqa: E402

PATHS = ("extender", "placement")
DEVICES = "/apis/scheduling.koordinator.sh/v1alpha1/devices"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
ALLOCATED_NODE = "topoalloc.io/allocated-node"
NODES = "dgx-h100=6,dgx1-v100=6,a100-pcie-4x-nvlink-pairs=4"
JOINT = "scheduling.koordinator.sh/device-joint-allocate"
HINT = "scheduling.koordinator.sh/device-allocate-hint"
VF = {HINT: '{"rdma":{"vfSelector":{}}}'}  # a VF of the NIC (DGX H100's NICs have them, DGX-1's not)
ANY_SCOPE = {JOINT: '{"deviceTypes":["gpu","rdma"]}'}
SAME_PCIE = {JOINT: '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}', **VF}

# (name, weight, GPUs it takes, resources, annotations)
SHAPES: list[tuple[str, float, float, dict[str, str], dict[str, str]]] = [
    ("share", 0.22, 0.5, {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}, {}),
    ("gpu1", 0.30, 1, {"nvidia.com/gpu": "1"}, {}),
    ("gpu2", 0.18, 2, {"nvidia.com/gpu": "2"}, {}),
    ("gpu4", 0.05, 4, {"nvidia.com/gpu": "4"}, {}),
    ("joint1", 0.12, 1, {"nvidia.com/gpu": "1", "koordinator.sh/rdma": "1"}, ANY_SCOPE),
    ("joint2", 0.08, 2, {"nvidia.com/gpu": "2", "koordinator.sh/rdma": "1"}, SAME_PCIE),
    ("koord", 0.05, 1, {"koordinator.sh/gpu": "100", "koordinator.sh/rdma": "100"}, {**ANY_SCOPE, **VF}),
]


def workload(count: int, seed: int, fill: float, gpus: int) -> list[dict[str, Any]]:
    """`count` pods drawn by weight (dropped from the end until they ask at most `fill` of `gpus`),
    named in creation order so that both paths' queues take them in that order."""
    rng = random.Random(seed)
    drawn = rng.choices(SHAPES, weights=[s[1] for s in SHAPES], k=count)
    while drawn and sum(s[2] for s in drawn) > fill * gpus:
        drawn.pop()
    pods = []
    for i, (shape, _w, _g, resources, notes) in enumerate(drawn):
        limits = {"cpu": "2", "memory": "8Gi", **resources}
        pods.append({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p{i:03d}-{shape}", "annotations": dict(notes)},
            "spec": {
                "containers": [{"name": "main", "image": "registry.example/train:1",
                                "resources": {"limits": limits, "requests": dict(limits)}}],
                "terminationGracePeriodSeconds": 0,
            },
        })  # fmt: skip
    return pods


def register_nodes(cp: ControlPlane, counts: dict[str, int]) -> dict[str, NodeInventory]:
    """Each fixture machine as a Node (the capacity the agent publishes without a device plugin,
    `nvidia.com/gpu` as the vendor's plugin counts it) and its Device; returns their inventories."""
    out = {}
    for fixture, count in counts.items():
        for i in range(count):
            node, device = fixture_objects(fixture, f"{fixture}-{i:02d}")
            name = node["metadata"]["name"]
            capacity = dict(node["status"]["allocatable"])
            if device is not None:
                extended = node_resources(Device.from_dict(device))
                capacity.update({k: v for k, v in extended.items() if v is not None})
                capacity["nvidia.com/gpu"] = str(
                    sum(1 for d in device["spec"]["devices"] if d["type"] == "gpu")
                )
                cp.admin.post(DEVICES, device)
                out[name] = build_inventory(device, node["metadata"]["labels"])
            cp.create_node(name, capacity=capacity, labels=node["metadata"]["labels"])
    return out


def webhooks(cp: ControlPlane, replica: AllocatorReplica | None, certs: Path) -> None:
    """deploy/'s webhook configuration (placement mode) calling `replica` directly; None: removed."""
    config = next(d for d in build(REPO / "deploy") if d["kind"] == "MutatingWebhookConfiguration")
    with contextlib.suppress(ApiStatus):
        cp.admin.delete(f"{WEBHOOKS}/{config['metadata']['name']}")
    if replica is None:
        return
    ca = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
    for hook in config["webhooks"]:
        path = hook["clientConfig"]["service"].get("path", "/")
        hook["clientConfig"] = {"url": f"https://{HOST}:{replica.webhook_port}{path}", "caBundle": ca}
    cp.admin.post(WEBHOOKS, config)


@dataclass
class Outcome:
    """One path's result: what each pod got (node, GPU minors, NIC minors) and the counts."""

    path: str
    run: int = 1
    seconds: float = 0.0
    binds: str = ""  # the extender's bind answers (kube-scheduler retries a refused bind)
    got: dict[str, tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)  # pod not placed -> why, as it says
    placed: int = 0
    elsewhere: int = 0  # bound on another node than its allocation was made for
    multi: int = 0
    together: int = 0  # multi-GPU pods on one NVLink domain or PCIe switch
    at_best: int = 0
    joint: int = 0
    nic_same: int = 0
    nic_possible: int = 0
    nic_possible_same: int = 0


def judge(path: str, pods: list[dict[str, Any]], inventories: dict[str, NodeInventory]) -> Outcome:
    out = Outcome(path)
    for pod in pods:
        node = pod["spec"].get("nodeName")
        annotations = pod["metadata"].get("annotations") or {}
        if not node or ALLOCATED not in annotations:
            out.waiting[pod["metadata"]["name"]] = _why_waiting(pod)
            continue
        if path == "placement" and annotations.get(ALLOCATED_NODE) != node:
            out.elsewhere += 1
            continue
        out.placed += 1
        allocated = parse_device_allocated(annotations[ALLOCATED])
        gpus = [e.minor for e in allocated["gpu"]]
        nics = [e.minor for e in allocated["rdma"]]
        out.got[pod["metadata"]["name"]] = (node, tuple(sorted(gpus)), tuple(sorted(nics)))
        cores = [(e.resources or {}).get("koordinator.sh/gpu-core") for e in allocated["gpu"]]
        whole = all(c is None or c.value() == 100 for c in cores)  # not a share of a GPU
        q = placement_quality(inventories.get(node), gpus, nics, whole)
        if q.gpus >= 2 and q.level is not None:
            out.multi += 1
            out.together += q.level >= PCIE
            out.at_best += q.best is not None and q.level >= q.best
        if q.nic is not None:
            out.joint += 1
            out.nic_same += q.nic == PCIE
            out.nic_possible += q.nic_possible
            out.nic_possible_same += q.nic_possible and q.nic == PCIE
    return out


def _why_waiting(pod: dict[str, Any]) -> str:
    """The message of a pending pod's PodScheduled or topoalloc.io/Placed condition."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "False" and cond.get("type") in ("PodScheduled", "topoalloc.io/Placed"):
            return str(cond.get("message", ""))
    return "bound without an allocation" if pod["spec"].get("nodeName") else "no reason given"


def run_path(
    cp: ControlPlane,
    path: str,
    run: int,
    pods: list[dict[str, Any]],
    where: tuple[Path, Path],
    args: argparse.Namespace,
) -> tuple[list[dict[str, Any]], float, str]:
    """Start the allocator for `path`, set kube-scheduler and the webhooks up, create the pods in
    order and wait until each is bound or nothing more binds for `--settle` seconds; returns the
    pods as the API server has them then, the seconds from the first created to the last bound and
    (extender) the allocator's bind answers; leaves the cluster empty for the next path."""
    certs, workdir = where
    placement = path == "placement"
    mode = {"extra_args": ("--placement",)} if placement else {"round_trips": 1}
    identity = f"bench-{path}-{run}"
    replica = start_replica(cp, certs, workdir, identity, **mode)
    namespace = f"topology-{path}-{run}"
    try:
        replica.wait_ready(timeout=600)
        deadline = time.monotonic() + 60
        while lease_holder(cp) != identity and time.monotonic() < deadline:
            time.sleep(0.2)
        url = None if placement else f"https://{HOST}:{replica.port}"
        cp.start_scheduler(scheduler_settings(args.qps, url, certs, 1 if url else None))
        webhooks(cp, replica if placement else None, certs)
        cp.create_namespace(namespace)
        watch = BindWatch(cp, namespace)
        start = time.monotonic()
        try:
            for pod in pods:
                cp.admin.post(f"/api/v1/namespaces/{namespace}/pods", pod)
            last, seen = time.monotonic(), 0
            while len(watch.bound) < len(pods) and time.monotonic() - last < args.settle:
                if len(watch.bound) != seen:
                    last, seen = time.monotonic(), len(watch.bound)
                time.sleep(0.2)
            took = max(watch.bound.values(), default=start) - start
        finally:
            watch.close()
        time.sleep(1.0)  # the last bindings' annotations are in
        got = cp.admin.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        print(
            f"{path} {run}: {len(watch.bound)}/{len(pods)} bound in {took:.1f} s (load {load_average()})",
            flush=True,
        )
        binds = (
            ""
            if placement
            else " ".join(c for c in request_counts(replica.health_port).split() if "bind" in c)
        )
        return got, took, binds
    finally:
        webhooks(cp, None, certs)
        cp.stop_scheduler()
        with contextlib.suppress(Exception):
            delete_pods(cp, namespace)
        replica.process.stop()


def _same(a: Outcome, b: Outcome) -> str:
    both = a.got.keys() & b.got.keys()
    return (
        f"{sum(1 for name in both if a.got[name] == b.got[name])} of the {len(both)} pods placed both times"
    )


def report(outcomes: list[Outcome], pods: int) -> None:
    def pct(part: int, whole: int) -> str:
        return f"{100 * part / whole:.1f}" if whole else "-"

    columns = ("path", "run", "pods", "placed", "elsewhere", "multi-GPU", "NVLink/switch %", "at best %",
               "joint", "NIC same switch %", "where possible %", "seconds")  # fmt: skip
    print()
    width = [max(len(c), 9 if c == "path" else 5) for c in columns]
    print(" ".join(f"{c:>{w}}" for c, w in zip(columns, width, strict=True)))
    for o in outcomes:
        row = (
            *(o.path, o.run, pods, o.placed, o.elsewhere, o.multi),
            *(pct(o.together, o.multi), pct(o.at_best, o.multi), o.joint, pct(o.nic_same, o.joint)),
            *(pct(o.nic_possible_same, o.nic_possible), f"{o.seconds:.1f}"),
        )
        print(" ".join(f"{v!s:>{w}}" for v, w in zip(row, width, strict=True)))
    for o in outcomes:
        for name, why in sorted(o.waiting.items()):
            print(f"{o.path} {o.run}: {name} not placed: {why[:160]}")
        if o.binds:
            print(f"{o.path} {o.run}: the allocator's bind answers {o.binds}")
    firsts = {o.path: o for o in outcomes if o.run == 1}
    for o in outcomes:
        if o.run > 1:
            print(f"{o.path} run {o.run}, same node and devices as its run 1: {_same(firsts[o.path], o)}")
    for run in sorted({o.run for o in outcomes}):
        pair = [o for o in outcomes if o.run == run]
        if len(pair) == 2:
            print(f"run {run}, same node and devices both ways: {_same(*pair)}")
    print("(multi-GPU: placed pods of 2+ whole GPUs; NVLink/switch: their GPUs share one NVLink domain or "
          "PCIe switch; at best: the best level their node offers that many GPUs; joint: GPU+RDMA pods; "
          "NIC same switch: each GPU's NIC behind its own PCIe switch; where possible: of those whose node "
          "had such a NIC for each GPU; seconds: first created to last bound)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default=NODES, help="hw-fixture machines: NAME=COUNT,...")
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--fill", type=float, default=0.95, help="at most this share of the GPUs asked")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--release", default="1.35", choices=sorted(RELEASES))
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--qps", type=int, default=1000, help="kube-scheduler's client qps and burst")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds without a new binding: done")
    parser.add_argument("--runs", type=int, default=2, help="each path this many times, alternated")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--json", type=Path, help="write each path's pods (node, GPU and NIC minors) here")
    args = parser.parse_args(argv)
    release = RELEASES[args.release]
    missing = missing_parts(release)
    if missing:
        print("placement_topology: skipped, this machine lacks " + "; ".join(missing))
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="topoalloc-topology-bench-"))
    print(f"work directory {workdir}, Kubernetes {release.version} (load {load_average()})", flush=True)
    certs = make_certs(workdir / "extender-pki")
    with ControlPlane(workdir / "k8s", scheduler=False, start_timeout=300, release=release) as cp:
        install(cp)
        inventories = register_nodes(cp, parse_counts(args.nodes))
        gpus = sum(len(inv.gpu_minors) for inv in inventories.values())
        pods = workload(args.pods, args.seed, args.fill, gpus)
        asked = sum(next(s[2] for s in SHAPES if p["metadata"]["name"].endswith("-" + s[0])) for p in pods)
        print(
            f"{len(inventories)} GPU nodes, {gpus} GPUs; {len(pods)} pods asking {asked:g} GPUs", flush=True
        )
        outcomes = []
        for run in range(1, args.runs + 1):
            for path in args.paths:
                got, took, binds = run_path(cp, path, run, pods, (certs, workdir), args)
                outcomes.append(judge(path, got, inventories))
                outcomes[-1].run, outcomes[-1].seconds, outcomes[-1].binds = run, took, binds
        report(outcomes, len(pods))
    if args.json:
        args.json.write_text(json.dumps({f"{o.path} {o.run}": o.got for o in outcomes}, indent=1))
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
