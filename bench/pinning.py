"""How to pin a gated pod to the node topoalloc chose, measured on the real control planes.

Placement mode decides a GPU pod's node and devices while the pod is held by a scheduling gate,
then lets kube-scheduler bind it. Two Kubernetes mechanisms can carry the node; this bench
measures what each costs kube-scheduler and the API server, with no allocator in the way (a
thread pool plays the allocator's writes, so only the mechanism differs):

* `affinity`: one PATCH per pod adds a required node affinity term (`matchFields metadata.name In
  [node]`, allowed while the pod is gated: KEP-3838) together with the annotation and the gate's
  removal;
* `nominate`: a PATCH of `status.nominatedNodeName` while the pod is gated (kube-scheduler tries a
  nominated node first and binds elsewhere when it does not fit: KEP-5278), then one PATCH with the
  annotation and the gate's removal;
* `none`: the same pods created without a gate, kube-scheduler alone (the baseline).

Per release and mode: pods/s from the first pod created to the last bound, the share of pods bound
on the node they were pinned to, and the writes per pod. Both releases in one run.

Run: `.venv/bin/python bench/pinning.py [--nodes 200] [--pods 300] [--runs 2] [--releases 1.35,1.36]`
(needs ../shared/k8s*, /usr/bin/etcd; exits 0 with a note when they are missing).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.scheduler_throughput import CAPACITY, BindWatch, bench_pod, parallel, scheduler_settings  # noqa: E402
from tests.support.controlplane import ControlPlane, missing_parts, wait_until  # noqa: E402
from tests.support.kube_releases import RELEASES  # noqa: E402

GATE = "topoalloc.io/placement"
ALLOCATED = "scheduling.koordinator.sh/device-allocated"
MODES = ("none", "affinity", "nominate")
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


def gated_pod(name: str) -> dict[str, Any]:
    pod = bench_pod(name)
    pod["spec"]["schedulingGates"] = [{"name": GATE}]
    return pod


def one_run(cp: ControlPlane, nodes: list[str], mode: str, pods: int, namespace: str) -> dict[str, float]:
    cp.create_namespace(namespace)
    base = f"/api/v1/namespaces/{namespace}/pods"
    names = [f"p-{i:05d}" for i in range(pods)]
    chosen = {name: nodes[i % len(nodes)] for i, name in enumerate(names)}
    watch = BindWatch(cp, namespace)
    writes = 0
    lock = threading.Lock()

    def place(name: str) -> None:
        nonlocal writes
        node = chosen[name]
        annotations = {"metadata": {"annotations": {ALLOCATED: '{"gpu":[{"minor":0}]}'}}}
        if mode == "affinity":
            term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            affinity = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            }
            body = {**annotations, "spec": {"schedulingGates": None, "affinity": affinity}}
            cp.admin.request("PATCH", f"{base}/{name}", body, content_type=STRATEGIC)
            done = 1
        else:
            cp.admin.request(
                "PATCH", f"{base}/{name}/status", {"status": {"nominatedNodeName": node}}, content_type=MERGE
            )
            cp.admin.request(
                "PATCH",
                f"{base}/{name}",
                {**annotations, "spec": {"schedulingGates": None}},
                content_type=STRATEGIC,
            )
            done = 2
        with lock:
            writes += done

    def create(name: str) -> None:
        cp.admin.post(base, bench_pod(name) if mode == "none" else gated_pod(name))
        if mode != "none":
            place(name)

    start = time.monotonic()
    try:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(create, names))
        wait_until(lambda: len(watch.bound) >= pods, timeout=600, what=f"{pods} pods bound", interval=0.05)
    finally:
        watch.close()
    span = max(watch.bound.values()) - start
    listed = cp.admin.get(base)["items"]
    pinned = sum(1 for p in listed if p["spec"].get("nodeName") == chosen[p["metadata"]["name"]])
    cp.admin.request("DELETE", base, query={"gracePeriodSeconds": 0})
    return {
        "pods_per_s": pods / span,
        "on_chosen_node": pinned / pods if mode != "none" else float("nan"),
        "writes_per_pod": writes / pods,
    }


def run_release(minor: str, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    release = RELEASES[minor]
    out: dict[str, dict[str, list[float]]] = {m: {} for m in MODES}
    with (
        tempfile.TemporaryDirectory(prefix=f"pinning-{minor}-") as tmp,
        ControlPlane(Path(tmp), release=release, scheduler=False) as cp,
    ):
        nodes = [f"gpu-{i:05d}" for i in range(args.nodes)]
        parallel(lambda name: cp.create_node(name, capacity=CAPACITY), nodes)  # no Device CRs: no allocator
        cp.start_scheduler(scheduler_settings(args.qps, None, Path(tmp)))
        for run in range(args.runs):
            for mode in MODES:  # alternated, so a busy moment of the machine hits every mode
                got = one_run(cp, nodes, mode, args.pods, f"{mode}-{run}")
                for key, value in got.items():
                    out[mode].setdefault(key, []).append(value)
        cp.stop_scheduler()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--qps", type=int, default=1000, help="kube-scheduler's client qps and burst")
    parser.add_argument("--releases", default="1.35,1.36")
    args = parser.parse_args(argv)
    releases = [m.strip() for m in args.releases.split(",") if m.strip()]
    for minor in releases:
        missing = missing_parts(RELEASES[minor])
        if missing:
            print(f"pinning: skipped, missing {', '.join(missing)}")
            return 0
    print(
        f"{args.nodes} nodes x 8 nvidia.com/gpu, {args.pods} one-GPU pods, kube-scheduler qps {args.qps}, "
        f"median of {args.runs} runs"
    )
    print(f"{'release':8} {'mode':9} {'pods/s':>8} {'vs none':>8} {'on chosen':>10} {'writes/pod':>11}")
    for minor in releases:
        got = run_release(minor, args)
        base = statistics.median(got["none"]["pods_per_s"])
        for mode in MODES:
            rate = statistics.median(got[mode]["pods_per_s"])
            chosen = statistics.median(got[mode]["on_chosen_node"])
            writes = statistics.median(got[mode]["writes_per_pod"])
            shown = "-" if chosen != chosen else f"{100 * chosen:.0f} %"
            print(f"{minor:8} {mode:9} {rate:8.1f} {rate / base:8.2f} {shown:>10} {writes:11.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
