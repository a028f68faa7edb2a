"""Placement mode's cost to the cluster, measured as users meet it, on a real control plane.

kube-scheduler (no extender, no topoalloc configuration; client qps/burst `--qps`) already runs;
N Nodes with their Device CRs (the dgx-h100 fixture: 8 GPUs + 8 NICs) are registered (as
bench/scheduler_throughput.py registers them); P one-GPU pods are created through the API server's
admission chain by 16 client threads, and pods/s is counted from the first pod created to the last
bound. Alternately:

* `alone`: kube-scheduler alone (no webhook; the allocator only watches);
* `placement`: deploy/'s webhook configuration calling the allocator started with --placement, which
  gates each pod at admission, places it (node and devices, joint choice, scoring), pins it to its
  node and removes its gate; kube-scheduler binds it. Every pod must end bound where placed, with
  its devices recorded.

Reported: median pods/s of each and their ratio, the allocator's CPU-seconds per pod (utime+stime
from the first create to the last bind and its watch events) and its RSS; then, with `--gang N`,
a gang of N one-GPU pods (a scheduler-plugins PodGroup) created at once: seconds from the last
member's creation to the last member bound.

Run: `.venv/bin/python bench/placement_throughput.py [--nodes 500] [--pods 500] [--runs 3] [--gang 40]
[--releases 1.35,1.36]` (needs ../shared/k8s and k8s-1.36, /usr/bin/etcd and /usr/bin/kubectl; a
release whose parts are missing is skipped with a note).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.extender import load_average, rss_mib  # noqa: E402
from bench.scheduler_throughput import (  # noqa: E402
    ALLOCATED,
    BindWatch,
    bench_pod,
    cpu_seconds,
    delete_pods,
    install,
    parallel,
    register_nodes,
    scheduler_settings,
    start_replica,
)
from tests.support.cluster_product import AllocatorReplica, lease_holder, make_certs  # noqa: E402
from tests.support.controlplane import HOST, ApiStatus, ControlPlane, missing_parts, wait_until  # noqa: E402
from tests.support.kube_releases import RELEASES, KubeRelease  # noqa: E402
from topoalloc.commands.installer.kustomize import build  # noqa: E402

MODES = ("alone", "placement")
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"


def webhooks(cp: ControlPlane, replica: AllocatorReplica, certs: Path, on: bool) -> None:
    """deploy/'s webhook configuration calling `replica` directly (on), or none (off)."""
    with contextlib.suppress(ApiStatus):
        cp.admin.delete(f"{WEBHOOKS}/topoalloc-gang")
    if not on:
        return
    config = next(d for d in build(REPO / "deploy") if d["kind"] == "MutatingWebhookConfiguration")
    ca = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
    for hook in config["webhooks"]:
        path = hook["clientConfig"]["service"].get("path", "/")
        hook["clientConfig"] = {"url": f"https://{HOST}:{replica.webhook_port}{path}", "caBundle": ca}
    cp.admin.post(WEBHOOKS, config)


def annotated_where_bound(cp: ControlPlane, namespace: str) -> int:
    """Bound pods whose recorded allocation names the node they are bound to."""
    pods = cp.admin.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    return sum(
        1
        for p in pods
        if p["spec"].get("nodeName")
        and ALLOCATED in (p["metadata"].get("annotations") or {})
        and p["metadata"]["annotations"].get("topoalloc.io/allocated-node") == p["spec"]["nodeName"]
    )


def control_plane_cpu(cp: ControlPlane) -> dict[str, float]:
    """CPU-seconds so far of each control-plane process (etcd, kube-apiserver, kube-scheduler)."""
    return {name: cpu_seconds(proc.pid) for name, proc in cp.processes.items() if proc.alive()}


def job_owner(cp: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    """A suspended Job in `namespace` as the controller of the run's pods (as a training job's
    pods have one; no job controller runs here, so it creates none itself)."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "bench"},
        "spec": {
            "suspend": True,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "cuda"}]}},
        },
    }
    got = cp.admin.post(f"/apis/batch/v1/namespaces/{namespace}/jobs", job)
    uid = got["metadata"]["uid"]
    return [{"apiVersion": "batch/v1", "kind": "Job", "name": "bench", "uid": uid, "controller": True}]


def run_pod(name: str, owners: list[dict[str, Any]]) -> dict[str, Any]:
    pod = bench_pod(name)
    if owners:
        pod["metadata"]["ownerReferences"] = owners
    return pod


def one_run(
    cp: ControlPlane, replica: AllocatorReplica, namespace: str, pods: int, timeout: float, owned: bool
) -> dict[str, float]:
    cp.create_namespace(namespace)
    owners = job_owner(cp, namespace) if owned else []
    watch = BindWatch(cp, namespace)
    cpu0 = cpu_seconds(replica.process.pid)
    parts0 = control_plane_cpu(cp)
    start = time.monotonic()
    try:
        parallel(
            lambda i: cp.admin.post(f"/api/v1/namespaces/{namespace}/pods", run_pod(f"p-{i:05d}", owners)),
            list(range(pods)),
        )
        wait_until(
            lambda: len(watch.bound) >= pods, timeout=timeout, what=f"{pods} pods bound", interval=0.05
        )
        time.sleep(1.0)  # the allocator's last watch events of those pods
        cpu1 = cpu_seconds(replica.process.pid)
        parts1 = control_plane_cpu(cp)
    finally:
        watch.close()
    result = {
        "pods_per_s": pods / (max(watch.bound.values()) - start),
        "alloc_cpu_s": cpu1 - cpu0,
        "alloc_rss_mib": rss_mib(replica.process.pid),
        "placed": float(annotated_where_bound(cp, namespace)),
        **{f"{name}_cpu_s": parts1[name] - parts0[name] for name in parts0},
    }
    delete_pods(cp, namespace)
    return result


def gang_burst(cp: ControlPlane, size: int) -> float:
    """Seconds from the last member's creation to the last member bound."""
    namespace = "gang-burst"
    cp.create_namespace(namespace)
    group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
             "metadata": {"name": "burst"}, "spec": {"minMember": size}}  # fmt: skip
    cp.admin.post(PODGROUPS.format(ns=namespace), group)
    watch = BindWatch(cp, namespace)
    created: list[float] = []

    def member(i: int) -> None:
        pod = bench_pod(f"m-{i:03d}")
        pod["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "burst"}
        cp.admin.post(f"/api/v1/namespaces/{namespace}/pods", pod)
        created.append(time.monotonic())

    try:
        parallel(member, list(range(size)))
        wait_until(lambda: len(watch.bound) >= size, timeout=300, what="the gang bound", interval=0.02)
    finally:
        watch.close()
    took = max(watch.bound.values()) - max(created)
    delete_pods(cp, namespace)
    return took


def run(args: argparse.Namespace, workdir: Path, release: KubeRelease) -> int:
    certs = make_certs(workdir / "extender-pki")
    with ControlPlane(workdir / "k8s", release=release, scheduler=False, start_timeout=300) as cp:
        replica = None
        try:
            install(cp)
            t0 = time.monotonic()
            register_nodes(cp, args.nodes)
            print(f"{args.nodes} nodes + Devices registered in {time.monotonic() - t0:.0f} s", flush=True)
            profile = f"{args.cprofile}.{release.version}" if args.cprofile else None
            replica = start_replica(
                cp, certs, workdir, "bench-placement", cprofile=profile, extra_args=("--placement",)
            )
            replica.wait_ready(timeout=600)
            wait_until(lambda: lease_holder(cp) == "bench-placement", timeout=60, what="the allocator leads")
            cp.start_scheduler(scheduler_settings(args.qps, None, certs))
            results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
            for i in range(args.runs):
                for mode in MODES:  # alternated, so a busy moment of the machine hits both
                    webhooks(cp, replica, certs, mode == "placement")
                    load = load_average()
                    profiling = profile is not None and mode == "placement"
                    if profiling:
                        os.kill(replica.process.pid, signal.SIGUSR1)
                    try:
                        r = one_run(
                            cp, replica, f"run-{i}-{mode}", args.pods, args.timeout, args.owner == "job"
                        )
                    finally:
                        webhooks(cp, replica, certs, False)
                        if profiling:  # the placement runs' profile so far, in the allocator's CPU time
                            os.kill(replica.process.pid, signal.SIGUSR2)
                    if mode == "placement" and r["placed"] != args.pods:
                        raise RuntimeError(
                            f"{args.pods - r['placed']:.0f} pods not bound where they were placed"
                        )
                    results[mode].append(r)
                    per_pod = 1000 * r["alloc_cpu_s"] / args.pods
                    print(f"run {i} {mode:>9}: {r['pods_per_s']:7.1f} pods/s, allocator {per_pod:6.2f} ms "
                          f"CPU/pod, RSS {r['alloc_rss_mib']:.0f} MiB (load {load})", flush=True)  # fmt: skip
            report(args, results, release)
            if args.gang:
                webhooks(cp, replica, certs, True)
                took = gang_burst(cp, args.gang)
                print(f"gang of {args.gang}: all bound {took:.2f} s after the last member's creation "
                      f"(load {load_average()})")  # fmt: skip
        finally:
            if replica is not None:
                replica.process.stop()
            cp.stop_scheduler()
    return 0


def report(
    args: argparse.Namespace, results: dict[str, list[dict[str, float]]], release: KubeRelease
) -> None:
    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[mode])

    alone, ours = med("alone", "pods_per_s"), med("placement", "pods_per_s")
    print()
    print(f"Kubernetes {release.version}")
    print(f"{'nodes':>6} {'pods':>6} {'runs':>4} {'mode':>9} {'pods/s':>8} {'ratio':>6} "
          f"{'alloc CPU ms/pod':>17} {'alloc RSS MiB':>14}")  # fmt: skip
    for mode, rate in (("alone", alone), ("placement", ours)):
        cpu = 1000 * med(mode, "alloc_cpu_s") / args.pods
        rss = max(r["alloc_rss_mib"] for r in results[mode])
        print(f"{args.nodes:>6} {args.pods:>6} {args.runs:>4} {mode:>9} {rate:>8.1f} {rate / alone:>6.2f} "
              f"{cpu:>17.2f} {rss:>14.0f}")  # fmt: skip
    print()
    print("CPU ms per pod, median over the runs:")
    names = sorted({k[: -len("_cpu_s")] for r in results["alone"] for k in r if k.endswith("_cpu_s")})
    print(f"{'mode':>9} " + " ".join(f"{n:>15}" for n in names))
    for mode in MODES:
        print(f"{mode:>9} " + " ".join(f"{1000 * med(mode, n + '_cpu_s') / args.pods:>15.2f}" for n in names))
    print("(pods created while kube-scheduler runs; pods/s from the first created to the last bound, "
          "median over the runs; ratio: against kube-scheduler alone; `alone`: the allocator only "
          "watched)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3, help="runs per mode, alternated")
    parser.add_argument("--qps", type=int, default=1000, help="kube-scheduler's client qps and burst")
    parser.add_argument("--gang", type=int, default=40, help="then a gang of this many pods (0: none)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take")
    parser.add_argument(
        "--cprofile", metavar="PATH", help="profile the allocator in the placement runs: PATH.<version>"
    )
    parser.add_argument(
        "--owner",
        choices=("job", "none"),
        default="job",
        help="the pods' controller: a Job (pinned by node affinity, one write) or none (bare pods: "
        "nominated, two writes)",
    )
    parser.add_argument("--releases", default="1.35,1.36", help="Kubernetes minors, one control plane each")
    args = parser.parse_args(argv)
    for minor in (m.strip() for m in args.releases.split(",") if m.strip()):
        if minor not in RELEASES:
            print(
                f"error: --releases: unknown release {minor} (known: {', '.join(RELEASES)})", file=sys.stderr
            )
            return 2
        missing = missing_parts(RELEASES[minor])
        if missing:
            print(f"placement_throughput {minor}: skipped, this machine lacks " + "; ".join(missing))
            continue
        workdir = Path(tempfile.mkdtemp(prefix=f"topoalloc-placement-bench-{minor}-"))
        print(
            f"Kubernetes {RELEASES[minor].version}: work directory {workdir} (load {load_average()})",
            flush=True,
        )
        run(args, workdir, RELEASES[minor])
    return 0


if __name__ == "__main__":
    sys.exit(main())
