"""Real kube-scheduler throughput with and without the topoalloc extender, on a real control plane.

Starts etcd + kube-apiserver from ../shared/k8s (tests/support/controlplane.py, the same launcher
the real-cluster tests use), registers N Nodes (POSTed with status: no kubelet) and their Device CRs
(the dgx-h100 hw-fixture's expected Device: 8 GPUs + 8 NICs), and one `topoalloc allocator`
process (leader election on, mTLS, started as users start it). Then, alternately, kube-scheduler
without an extender (`none`) and with the project's extender configuration in each mode
(`one-trip`: filter picks the node, no prioritizeVerb; `two-trip`: filter + prioritize; the
allocator restarted with the matching --round-trips) schedules the same P pending pods (1
nvidia.com/gpu each), created before it starts; pods/s from the first binding seen to the last.
Each run: a fresh kube-scheduler (client qps/burst `--qps`) and namespace, the pods deleted after.
Reported: median pods/s of each mode and its ratio to `none`, the allocator's CPU-seconds per
scheduled pod (utime+stime from /proc/<pid>/stat, from just before the pods are created until the
last binding and its watch events are in) and its RSS.

Extra phases: `--burst N`: N pods at once under the extender, the allocator's bind latency p50/p99
(its request duration histogram, interpolated in a bucket); `--failover`: a second replica's takeover
after the leader is killed (SIGKILL: its Lease expires) and stopped (SIGTERM: released).

Run: `.venv/bin/python bench/scheduler_throughput.py [--nodes 500] [--pods 500] [--runs 3]` (needs
../shared/k8s, etcd and kubectl; exits 0 with a note without them). Placement: placement_throughput.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import urllib3

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.extender import load_average, rss_mib  # noqa: E402
from tests.support.cluster_product import (  # noqa: E402
    SYSTEM_NAMESPACE,
    AllocatorReplica,
    lease_holder,
    make_certs,
    scheduler_config,
)
from tests.support.controlplane import (  # noqa: E402
    HOST,
    ApiStatus,
    ControlPlane,
    missing_parts,
    wait_until,
)
from tests.support.machines import machine_device  # noqa: E402

DEVICES = "/apis/scheduling.koordinator.sh/v1alpha1/devices"
ALLOCATED = "scheduling.koordinator.sh/device-allocated"
CAPACITY = {"cpu": "224", "memory": "2015Gi", "pods": "250", "nvidia.com/gpu": "8"}
TICKS = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------- process figures


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (fields 14 and 15 of /proc/<pid>/stat)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


# ------------------------------------------------------------------------------------ the world


def parallel(fn: Any, items: list[Any], workers: int = 16) -> None:
    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(fn, items):
            pass


def register_nodes(cp: ControlPlane, count: int) -> list[str]:
    names = [f"gpu-{i:05d}" for i in range(count)]
    template = machine_device("dgx-h100")
    labels = dict(template["metadata"].get("labels") or {})

    def one(name: str) -> None:
        cp.create_node(name, capacity=CAPACITY, labels=labels)
        device = json.loads(json.dumps(template))
        device["metadata"]["name"] = name
        cp.admin.post(DEVICES, device)

    parallel(one, names)
    return names


def bench_pod(name: str) -> dict[str, Any]:
    requests = {"nvidia.com/gpu": "1", "cpu": "1", "memory": "1Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "c", "image": "cuda", "resources": {"requests": requests, "limits": requests}}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def create_pods(cp: ControlPlane, namespace: str, count: int) -> None:
    cp.create_namespace(namespace)
    parallel(
        lambda i: cp.admin.post(f"/api/v1/namespaces/{namespace}/pods", bench_pod(f"p-{i:05d}")),
        list(range(count)),
    )


def delete_pods(cp: ControlPlane, namespace: str) -> None:
    cp.admin.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", query={"gracePeriodSeconds": 0})
    wait_until(
        lambda: not cp.admin.get(f"/api/v1/namespaces/{namespace}/pods", limit=1)["items"],
        timeout=300,
        what=f"pods of {namespace} deleted",
    )


def annotated(cp: ControlPlane, namespace: str) -> float:
    """How many bound pods of `namespace` carry the device-allocated annotation."""
    pods = cp.admin.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    bound = [p for p in pods if p["spec"].get("nodeName")]
    return float(sum(1 for p in bound if ALLOCATED in (p["metadata"].get("annotations") or {})))


class BindWatch:
    """Watches a namespace's pods and notes when each is first seen bound (monotonic seconds)."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.bound: dict[str, float] = {}
        self.stop = threading.Event()
        cp.watch_pods(namespace, self._event, self.stop, "bind-watch")

    def _event(self, event: dict[str, Any]) -> None:
        obj = event.get("object") or {}
        name = (obj.get("metadata") or {}).get("name")
        if name and (obj.get("spec") or {}).get("nodeName") and name not in self.bound:
            self.bound[name] = time.monotonic()

    def close(self) -> None:
        self.stop.set()


# ------------------------------------------------------------------------------------ the runs


def scheduler_settings(
    qps: int, extender_url: str | None, certs: Path, round_trips: int | None = None
) -> dict[str, Any]:
    if extender_url:
        config = scheduler_config(extender_url, certs, round_trips)
    else:
        config = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
    config["clientConnection"] = {"qps": qps, "burst": qps}
    return config


def one_run(
    cp: ControlPlane, allocator_pid: int, namespace: str, pods: int, config: dict[str, Any], timeout: float
) -> dict[str, float]:
    cpu0 = cpu_seconds(allocator_pid)
    create_pods(cp, namespace, pods)
    watch = BindWatch(cp, namespace)
    try:
        cp.start_scheduler(config)
        wait_until(
            lambda: len(watch.bound) >= pods, timeout=timeout, what=f"{pods} pods bound", interval=0.05
        )
        # The allocator's last watch events of those pods (bound, annotated) come in just after.
        time.sleep(1.0)
        cpu1 = cpu_seconds(allocator_pid)
    finally:
        watch.close()
        cp.stop_scheduler()
    times = sorted(watch.bound.values())
    span = times[-1] - times[0]
    result = {
        "pods_per_s": (len(times) - 1) / span if span > 0 else float("nan"),
        "alloc_cpu_s": cpu1 - cpu0,
        "alloc_rss_mib": rss_mib(allocator_pid),
        "annotated": annotated(cp, namespace),
    }
    if config.get("extenders") and result["annotated"] != pods:
        # The allocator's bind writes device-allocated within the binding: every pod must have it.
        raise RuntimeError(f"{pods - result['annotated']:.0f} pods bound without {ALLOCATED}")
    delete_pods(cp, namespace)
    return result


def histogram(health_port: int, verb: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of the allocator's request duration histogram for `verb`."""
    text = urllib3.PoolManager().request("GET", f"http://{HOST}:{health_port}/metrics").data.decode()
    prefix = "topoalloc_extender_request_duration_seconds_bucket{"
    out = []
    for line in text.splitlines():
        if line.startswith(prefix) and f'verb="{verb}"' in line:
            labels, value = line[len(prefix) :].rsplit("} ", 1)
            le = labels.split('le="')[1].split('"')[0]
            out.append((float(le), float(value)))
    return sorted(out)


def request_counts(health_port: int) -> str:
    """The allocator's extender requests by verb and result, as one line."""
    text = urllib3.PoolManager().request("GET", f"http://{HOST}:{health_port}/metrics").data.decode()
    out = []
    for line in text.splitlines():
        if line.startswith("topoalloc_extender_requests_total{"):
            labels, value = line.split("{", 1)[1].rsplit("} ", 1)
            fields = dict(part.split("=", 1) for part in labels.split(","))
            out.append(
                f"{fields['verb'].strip(chr(34))}/{fields['result'].strip(chr(34))}={float(value):.0f}"
            )
    return " ".join(sorted(out))


def quantile(before: list[tuple[float, float]], after: list[tuple[float, float]], q: float) -> float:
    """The q-quantile of the observations between two scrapes (linear within a bucket)."""
    base = dict(before)
    counts = [(le, n - base.get(le, 0.0)) for le, n in after]
    total = counts[-1][1]
    rank = q * total
    lower_le, lower_n = 0.0, 0.0
    for le, n in counts:
        if n >= rank:
            if le == float("inf"):
                return lower_le
            return lower_le + (le - lower_le) * ((rank - lower_n) / max(n - lower_n, 1e-9))
        lower_le, lower_n = le, n
    return float("nan")


def burst(cp: ControlPlane, replica: AllocatorReplica, config: dict[str, Any], pods: int) -> dict[str, float]:
    before = histogram(replica.health_port, "bind")
    result = one_run(cp, replica.process.pid, "burst", pods, config, timeout=600)
    after = histogram(replica.health_port, "bind")
    return {
        "pods_per_s": result["pods_per_s"],
        "bind_p50_ms": 1000 * quantile(before, after, 0.5),
        "bind_p99_ms": 1000 * quantile(before, after, 0.99),
    }


def failover(
    cp: ControlPlane, certs: Path, workdir: Path, replicas: list[AllocatorReplica]
) -> dict[str, float]:
    """Takeover times with the production Lease settings (15 s lease, 10 s renew, 2 s retry).
    The standbys go into `replicas`, which the caller stops."""
    out: dict[str, float] = {}
    leader = replicas[0]
    for how, stop in (("SIGKILL", lambda r: r.process.kill()), ("SIGTERM", lambda r: r.process.stop())):
        standby = start_replica(cp, certs, workdir, f"standby-{how.lower()}")
        replicas.append(standby)
        wait_until(lambda r=standby: r.health("/syncz")[0] == 200, timeout=300, what="standby synced")
        t0 = time.monotonic()
        stop(leader)
        standby.wait_ready(timeout=120)
        out[f"failover_{how}_s"] = time.monotonic() - t0
        leader = standby
    out["leader_pid"] = leader.process.pid
    return out


# The allocator under cProfile counting CPU time (not wall time: on a busy machine a wall-clock
# profile charges waiting for a CPU to whatever call was running). SIGUSR1 starts it (after the
# start-up, so only the runs are profiled), SIGUSR2 writes the stats.
CPROFILE = (
    "import cProfile, signal, sys, time; from topoalloc.cli import main; sys.argv[0] = 'topoalloc'; "
    "p = cProfile.Profile(time.process_time); "
    "signal.signal(signal.SIGUSR1, lambda *_: p.enable()); "
    "signal.signal(signal.SIGUSR2, lambda *_: (p.disable(), p.dump_stats({out!r}))); main()"
)


def start_replica(
    cp: ControlPlane,
    certs: Path,
    workdir: Path,
    identity: str,
    cprofile: str | None = None,
    round_trips: int | None = None,
    extra_args: tuple[str, ...] = (),  # bench/placement_throughput.py: --placement
) -> AllocatorReplica:
    replica = AllocatorReplica(
        cp.admin_kubeconfig,
        certs,
        workdir,
        identity,
        lease_duration=15,
        renew_deadline=10,
        retry_period=2,
        round_trips=round_trips,
        extra_args=extra_args,
    )
    # Info logging as a deployment runs it, not the tests' debug logging.
    argv = [a for a in replica.process.argv if a != "-vv"]
    if cprofile:
        argv = [
            sys.executable,
            "-c",
            CPROFILE.format(out=cprofile),
            *argv[-(len(argv) - argv.index("allocator")) :],
        ]
    replica.process.argv = argv
    return replica.start()


def profile(out: str | None, pid: int) -> subprocess.Popen[bytes] | None:
    """py-spy (pip install py-spy) sampling the allocator until the runs end."""
    if not out:
        return None
    spy = Path(sys.executable).parent / "py-spy"
    fmt = "raw" if out.endswith(".txt") else "flamegraph"
    argv = [str(spy), "record", "--pid", str(pid), "--rate", "200", "--format", fmt, "-o", out]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def install(cp: ControlPlane) -> None:
    cp.kubectl("apply", "-k", str(REPO / "deploy" / "crds"))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=120s", "crd", "--all")
    with contextlib.suppress(ApiStatus):
        cp.create_namespace(SYSTEM_NAMESPACE)


def median_row(results: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in results)


# The extender modes (docs/service.md, "Round trips"): the allocator's --round-trips.
ROUND_TRIPS = {"one-trip": 1, "two-trip": 2}
MODES = ("none", *ROUND_TRIPS)


class Allocators:
    """The one allocator process, restarted in another mode when a run needs it (a stopped
    leader releases its Lease, so the next one leads at once)."""

    def __init__(self, cp: ControlPlane, certs: Path, workdir: Path, cprofile: str | None) -> None:
        self.cp, self.certs, self.workdir, self.cprofile = cp, certs, workdir, cprofile
        self.current: AllocatorReplica | None = None
        self.round_trips = 0
        self.started: list[AllocatorReplica] = []

    def get(self, round_trips: int) -> AllocatorReplica:
        if self.current is not None and self.round_trips == round_trips:
            return self.current
        if self.current is not None:
            self.current.process.stop()
        identity = f"bench-{len(self.started)}"
        replica = start_replica(self.cp, self.certs, self.workdir, identity, self.cprofile, round_trips)
        self.started.append(replica)
        replica.wait_ready(timeout=600)
        wait_until(lambda: lease_holder(self.cp) == identity, timeout=60, what=f"{identity} leads")
        if self.cprofile:
            os.kill(replica.process.pid, signal.SIGUSR1)
        self.current, self.round_trips = replica, round_trips
        return replica

    def stop(self) -> None:
        for replica in self.started:
            replica.process.stop()


def run(args: argparse.Namespace, workdir: Path) -> int:
    certs = make_certs(workdir / "extender-pki")
    extenders = [m for m in args.modes if m != "none"]
    if (args.cprofile or args.py_spy) and len(extenders) != 1:
        raise SystemExit("--cprofile and --py-spy profile one allocator: name one extender mode in --modes")
    with ControlPlane(workdir / "k8s", scheduler=False, start_timeout=300) as cp:
        allocators = Allocators(cp, certs, workdir, args.cprofile)
        try:
            install(cp)
            t0 = time.monotonic()
            register_nodes(cp, args.nodes)
            print(f"{args.nodes} nodes + Devices registered in {time.monotonic() - t0:.0f} s", flush=True)
            first = ROUND_TRIPS[extenders[0]] if extenders else 1
            replica = allocators.get(first)
            print(f"allocator ready, RSS {rss_mib(replica.process.pid):.0f} MiB", flush=True)
            url = f"https://{HOST}:{replica.port}"
            results: dict[str, list[dict[str, float]]] = {m: [] for m in args.modes}
            profiler = profile(args.py_spy, replica.process.pid)
            for i in range(args.runs):
                for mode in args.modes:
                    trips = ROUND_TRIPS.get(mode)
                    replica = allocators.get(trips) if trips else replica
                    url = f"https://{HOST}:{replica.port}"
                    config = scheduler_settings(args.qps, url if trips else None, certs, trips)
                    load = load_average()
                    r = one_run(cp, replica.process.pid, f"run-{i}-{mode}", args.pods, config, args.timeout)
                    results[mode].append(r)
                    per_pod = 1000 * r["alloc_cpu_s"] / args.pods
                    print(
                        f"run {i} {mode:>9}: {r['pods_per_s']:7.1f} pods/s, allocator "
                        f"{per_pod:6.2f} ms CPU/pod, RSS {r['alloc_rss_mib']:.0f} MiB (load {load})",
                        flush=True,
                    )
            if args.cprofile and allocators.current is not None:
                os.kill(allocators.current.process.pid, signal.SIGUSR2)
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                profiler.wait(60)
            print("allocator requests (last process): " + request_counts(replica.health_port), flush=True)
            if "none" in results and extenders:
                report(args, results)
            if args.burst:
                trips = allocators.round_trips or first
                config = scheduler_settings(args.qps, url, certs, trips)
                b = burst(cp, replica, config, args.burst)
                print(
                    f"burst of {args.burst} pods ({trips} round trips): {b['pods_per_s']:.1f} pods/s, bind "
                    f"p50 {b['bind_p50_ms']:.1f} ms, p99 {b['bind_p99_ms']:.1f} ms (load {load_average()})"
                )
            if args.failover:
                replicas = [replica]
                try:
                    f = failover(cp, certs, workdir, replicas)
                finally:
                    for r in replicas:
                        r.process.stop()
                print(
                    f"failover (15 s lease): leader killed {f['failover_SIGKILL_s']:.1f} s, "
                    f"leader stopped {f['failover_SIGTERM_s']:.2f} s"
                )
        finally:
            allocators.stop()
            cp.stop_scheduler()
    return 0


def report(args: argparse.Namespace, results: dict[str, list[dict[str, float]]]) -> None:
    none = median_row(results["none"], "pods_per_s")
    idle = 1000 * median_row(results["none"], "alloc_cpu_s") / args.pods
    print()
    print(f"{'nodes':>6} {'pods':>6} {'runs':>4} {'mode':>9} {'pods/s':>8} {'ratio':>6} "
          f"{'alloc CPU ms/pod':>17} {'alloc RSS MiB':>14}")  # fmt: skip
    print(f"{args.nodes:>6} {args.pods:>6} {args.runs:>4} {'none':>9} {none:>8.1f} {1:>6.2f} "
          f"{idle:>17.2f} {'':>14}")  # fmt: skip
    for mode in ROUND_TRIPS:
        if mode not in results:
            continue
        ours = median_row(results[mode], "pods_per_s")
        cpu = 1000 * median_row(results[mode], "alloc_cpu_s") / args.pods
        rss = max(r["alloc_rss_mib"] for r in results[mode])
        print(f"{args.nodes:>6} {args.pods:>6} {args.runs:>4} {mode:>9} {ours:>8.1f} {ours / none:>6.2f} "
              f"{cpu:>17.2f} {rss:>14.0f}")  # fmt: skip
    print("(pods/s: median over the runs; ratio: against kube-scheduler without the extender; alloc CPU "
          "ms/pod: median; for `none` the allocator only watched)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3, help="runs per mode, alternated")
    parser.add_argument("--qps", type=int, default=1000, help="kube-scheduler's client qps and burst")
    parser.add_argument("--burst", type=int, default=0, help="then a burst of this many pods (bind latency)")
    parser.add_argument("--failover", action="store_true", help="then time a leader failover")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take")
    parser.add_argument(
        "--modes", nargs="+", choices=MODES, default=list(MODES), help="alternated in this order, each run"
    )
    parser.add_argument("--py-spy", metavar="SVG", help="record the allocator with py-spy into SVG")
    parser.add_argument("--cprofile", metavar="OUT", help="run the allocator under cProfile (CPU time)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    missing = missing_parts()
    if missing:
        print("scheduler_throughput: skipped, this machine lacks " + "; ".join(missing))
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="topoalloc-sched-bench-"))
    print(f"work directory {workdir} (load {load_average()})", flush=True)
    try:
        return run(args, workdir)
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
