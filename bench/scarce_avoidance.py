"""What scarce-resource avoidance costs on a real control plane: kube-scheduler pods/s for CPU-only
pods with and without the preferred node affinity, and the admission webhook's latency.

Starts etcd + kube-apiserver from ../shared/k8s (tests/support/controlplane.py), registers N Nodes
(two thirds GPU nodes: `node.koordinator.sh/gpu-vendor` and 8 nvidia.com/gpu; a third CPU-only; all
of one size) and one `topoalloc allocator` process (its webhook server).

* **Scheduling**: alternately, a fresh kube-scheduler schedules P pending CPU-only pods created
  before it starts, `plain` (as users write them) or `preferred` (with the term the webhook adds,
  written into the pods directly, so only kube-scheduler's cost is measured). pods/s from the first
  binding seen on a watch to the last; the share of pods that landed on GPU nodes. CPU-only pods never
  reach the extender (managedResources), so kube-scheduler runs without one.
* **Admission**: alternately with and without the MutatingWebhookConfiguration of the route alone,
  Q pods are created one after another; the client-side latency of each create (p50, p99) and the
  allocator's CPU per reviewed pod.

Run: `.venv/bin/python bench/scarce_avoidance.py [--nodes 300] [--pods 500] [--creates 300] [--runs 3]`
(needs ../shared/k8s, /usr/bin/etcd and /usr/bin/kubectl; exits 0 with a note when they are missing).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from allocator.runtime.scarce_settings import ScarceAvoidanceSettings  # noqa: E402
from allocator.scarce.webhook import PATH, preference_patch, preferred_term  # noqa: E402
from bench.extender import load_average  # noqa: E402
from bench.scheduler_throughput import (  # noqa: E402
    BindWatch,
    cpu_seconds,
    delete_pods,
    install,
    parallel,
    scheduler_settings,
    start_replica,
)
from tests.support.cluster_product import make_certs  # noqa: E402
from tests.support.controlplane import HOST, ApiStatus, ControlPlane, missing_parts, wait_until  # noqa: E402

CAPACITY = {"cpu": "224", "memory": "2015Gi", "pods": "250"}
GPU_LABELS = {"node.koordinator.sh/gpu-vendor": "nvidia"}
CONFIG = "topoalloc-scarce-bench"
SETTINGS = ScarceAvoidanceSettings()


def register_nodes(cp: ControlPlane, count: int) -> set[str]:
    """`count` nodes, two thirds GPU nodes; the GPU nodes' names."""
    gpu = {f"n-{i:05d}" for i in range(count) if i % 3}

    def one(i: int) -> None:
        name = f"n-{i:05d}"
        if name in gpu:
            cp.create_node(name, capacity={**CAPACITY, "nvidia.com/gpu": "8"}, labels=GPU_LABELS)
        else:
            cp.create_node(name, capacity=CAPACITY)

    parallel(one, list(range(count)))
    return gpu


def cpu_pod(name: str, preferred: bool) -> dict[str, Any]:
    requests = {"cpu": "1", "memory": "1Gi"}
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "c", "image": "web", "resources": {"requests": requests, "limits": requests}}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }
    if preferred:
        pod["spec"]["affinity"] = {
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [preferred_term(SETTINGS)]}
        }
    return pod


def schedule_run(
    cp: ControlPlane, ns: str, pods: int, preferred: bool, gpu: set[str], timeout: float
) -> dict[str, float]:
    cp.create_namespace(ns)
    parallel(
        lambda i: cp.admin.post(f"/api/v1/namespaces/{ns}/pods", cpu_pod(f"p-{i:05d}", preferred)),
        list(range(pods)),
    )
    watch = BindWatch(cp, ns)
    try:
        cp.start_scheduler(scheduler_settings(1000, None, Path()))
        wait_until(
            lambda: len(watch.bound) >= pods, timeout=timeout, what=f"{pods} pods bound", interval=0.05
        )
    finally:
        watch.close()
        cp.stop_scheduler()
    times = sorted(watch.bound.values())
    items = cp.admin.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    on_gpu = sum(1 for p in items if p["spec"].get("nodeName") in gpu)
    delete_pods(cp, ns)
    return {"pods_per_s": (len(times) - 1) / (times[-1] - times[0]), "on_gpu": on_gpu / pods}


def webhook_config(port: int, ca: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIG},
        "webhooks": [
            {
                "name": "scarce-avoidance.topoalloc.io",
                "failurePolicy": "Fail",  # a bench that silently measured no webhook would lie
                "clientConfig": {
                    "url": f"https://{HOST}:{port}{PATH}",
                    "caBundle": base64.b64encode(ca).decode(),
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "timeoutSeconds": 2,
            }
        ],
    }


def set_webhook(cp: ControlPlane, on: bool, port: int, ca: bytes, ns: str) -> None:
    """Register (or remove) the configuration and wait until the API server acts on it."""
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    if on:
        cp.admin.post(path, webhook_config(port, ca))
    else:
        with contextlib.suppress(ApiStatus):
            cp.admin.delete(f"{path}/{CONFIG}")
    probes = iter(range(10**6))

    def settled() -> bool:
        name = f"probe-{next(probes)}"
        pod = cp.admin.post(f"/api/v1/namespaces/{ns}/pods", cpu_pod(name, False))
        cp.admin.delete(f"/api/v1/namespaces/{ns}/pods/{name}", gracePeriodSeconds=0)
        return ("affinity" in pod["spec"]) is on

    wait_until(settled, timeout=60, what=f"webhook {'on' if on else 'off'}", interval=0.2)


def admission_run(cp: ControlPlane, ns: str, creates: int, pid: int, on: bool) -> dict[str, float]:
    latencies = []
    cpu0 = cpu_seconds(pid)
    for i in range(creates):
        t0 = time.perf_counter()
        pod = cp.admin.post(f"/api/v1/namespaces/{ns}/pods", cpu_pod(f"c-{i:05d}", False))
        latencies.append(time.perf_counter() - t0)
        assert ("affinity" in pod["spec"]) is on, pod["spec"]
    cpu = cpu_seconds(pid) - cpu0
    delete_pods(cp, ns)
    latencies.sort()
    return {
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "alloc_cpu_ms": 1000 * cpu / creates,
    }


def handler_us(rounds: int = 20000) -> float:
    """The route's own decision for one pod, in-process (µs)."""
    pod = cpu_pod("x", False)
    t0 = time.perf_counter()
    for _ in range(rounds):
        preference_patch(copy.deepcopy(pod), SETTINGS)
    return 1e6 * (time.perf_counter() - t0) / rounds


def run(args: argparse.Namespace, workdir: Path) -> int:
    certs = make_certs(workdir / "pki")
    with ControlPlane(workdir / "k8s", scheduler=False, start_timeout=300) as cp:
        replica = None
        try:
            install(cp)
            gpu = register_nodes(cp, args.nodes)
            print(f"{args.nodes} nodes ({len(gpu)} GPU nodes) registered (load {load_average()})", flush=True)
            sched: dict[str, list[dict[str, float]]] = {"plain": [], "preferred": []}
            for i in range(args.runs):
                for mode in sched:
                    r = schedule_run(cp, f"s-{i}-{mode}", args.pods, mode == "preferred", gpu, args.timeout)
                    sched[mode].append(r)
                    print(
                        f"run {i} {mode:>9}: {r['pods_per_s']:7.1f} pods/s, "
                        f"{100 * r['on_gpu']:5.1f} % on GPU nodes (load {load_average()})",
                        flush=True,
                    )
            replica = start_replica(cp, certs, workdir, "bench-a")
            replica.wait_ready(timeout=300)
            ca = (certs / "ca.crt").read_bytes()
            adm: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
            for i in range(args.runs):
                for mode in adm:
                    ns = f"a-{i}-{mode}"
                    cp.create_namespace(ns)
                    set_webhook(cp, mode == "on", replica.webhook_port, ca, ns)
                    r = admission_run(cp, ns, args.creates, replica.process.pid, mode == "on")
                    adm[mode].append(r)
                    print(
                        f"run {i} webhook {mode:>3}: create p50 {r['p50_ms']:.2f} ms, "
                        f"p99 {r['p99_ms']:.2f} ms, allocator {r['alloc_cpu_ms']:.2f} ms CPU/pod "
                        f"(load {load_average()})",
                        flush=True,
                    )
            set_webhook(cp, False, replica.webhook_port, ca, "a-0-off")
        finally:
            if replica is not None:
                replica.process.stop()
            cp.stop_scheduler()
    report(args, sched, adm)
    return 0


def med(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def report(
    args: argparse.Namespace, sched: dict[str, list[dict[str, float]]], adm: dict[str, list[dict[str, float]]]
) -> None:
    plain, pref = med(sched["plain"], "pods_per_s"), med(sched["preferred"], "pods_per_s")
    on_gpu = [100 * med(sched[m], "on_gpu") for m in ("plain", "preferred")]
    print()
    print(f"{'nodes':>6} {'pods':>5} {'runs':>4} {'plain pods/s':>13} {'preferred pods/s':>17} {'ratio':>6} "
          f"{'plain on GPU':>13} {'preferred on GPU':>17}")  # fmt: skip
    print(f"{args.nodes:>6} {args.pods:>5} {args.runs:>4} {plain:>13.1f} {pref:>17.1f} {pref / plain:>6.2f} "
          f"{on_gpu[0]:>12.1f}% {on_gpu[1]:>16.1f}%")  # fmt: skip
    cols = [med(adm[m], k) for k in ("p50_ms", "p99_ms", "alloc_cpu_ms") for m in ("off", "on")]
    print()
    print(f"{'creates':>7} {'p50 off ms':>11} {'p50 on ms':>10} {'p99 off ms':>11} {'p99 on ms':>10} "
          f"{'alloc CPU ms/pod off':>21} {'on':>6} {'route µs/pod':>13}")  # fmt: skip
    print(f"{args.creates:>7} {cols[0]:>11.2f} {cols[1]:>10.2f} {cols[2]:>11.2f} {cols[3]:>10.2f} "
          f"{cols[4]:>21.2f} {cols[5]:>6.2f} {handler_us():>13.1f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--pods", type=int, default=500, help="CPU-only pods per scheduling run")
    parser.add_argument("--creates", type=int, default=300, help="pods created one by one per admission run")
    parser.add_argument("--runs", type=int, default=3, help="runs per mode, alternated")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one scheduling run may take")
    args = parser.parse_args(argv)
    missing = missing_parts()
    if missing:
        print("scarce_avoidance: skipped, this machine lacks " + "; ".join(missing))
        return 0
    with tempfile.TemporaryDirectory(prefix="topoalloc-scarce-bench-") as tmp:
        return run(args, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
