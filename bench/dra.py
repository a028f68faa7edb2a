"""DRA claims on a real control plane: topoalloc's allocation against kube-scheduler's own.

Starts etcd + kube-apiserver + kube-controller-manager from ../shared/k8s (the real-cluster tests'
launcher), registers N nodes in dra mode, each a DGX-1 (the dgx1-v100 hw-fixture: 8 V100 in the
hybrid cube-mesh with its NVLink pairs, 4 PCIe switches with two GPUs and one NIC each): the Node
(labelled topoalloc.io/device-mode=dra), its Device CR and its pool's ResourceSlices, built with the
node side's slice builder (agent/dra/slices.py); the DeviceClasses of deploy/dra; one `topoalloc
allocator` process. Then, per mode, P pods each with its own ResourceClaim, in a repeating mix:
  one   1 GPU
  pair  2 GPUs, no constraint (what users write; first fit may split an NVLink pair)
  nic   1 GPU + 1 NIC (whole RDMA NIC) with matchAttribute topoalloc.io/pcieSwitch
deploy/'s admission webhooks call the allocator as in a cluster (the DRA gate on pods, the mark on
claims). The claims are created first (untimed, through the webhook: topoalloc's marked at
creation); kube-scheduler (client qps/burst `--qps`; 50/100 are its defaults) is running; the pods
are created at once (16 threads) as users create them, ungated, and pods/s is
P / (last binding - first pod created). With several runs the modes alternate, each first in every
other pair.
  kube-scheduler  claims opted out (topoalloc.io/allocator: kube-scheduler): its own DRA allocator
  topoalloc       the webhook gates each pod; the allocator writes its claim's allocation and
                  removes the gate once its cache shows the write; kube-scheduler binds (it only
                  checks an allocated claim's node selector)
Where the time goes, per run: kube-apiserver's mean time in topoalloc's pod webhook
(dra.topoalloc.io, from its /metrics) and per PATCH of a claim's status and of a pod (its own
request duration of topoalloc's two writes; kube-scheduler's are updates, "nan" here), medians of
first seen -> claim allocated -> gate removed (topoalloc) -> bound, and the CPU seconds of every
control-plane process and of this bench's client; the table adds kube-scheduler's CPU and the CPU
of the control plane and the allocator together (on a machine whose cores they share, a run's span
follows that sum). Quality, for both, over the bound pods: NVLink
pairs kept (share of `pair` claims whose two GPUs are joined by the most NVLinks two GPUs of the
machine share: an NV2 pair of the DGX-1, like GPU0-GPU3; first fit's GPU0-GPU1, behind one switch,
share one) and GPU-NIC aligned (share of `nic` claims on one PCIe switch). Each mode's pods and
claims are deleted after its run.

Run: `.venv/bin/python bench/dra.py [--nodes 500] [--pods 1000] [--runs 1] [--release 1.36]`
(needs ../shared/k8s, /usr/bin/etcd and /usr/bin/kubectl; exits 0 with a note when they are missing).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.dra.slices import pool_devices, pool_slices  # noqa: E402
from apis import dra  # noqa: E402
from apis.device import Device  # noqa: E402
from bench.extender import load_average, rss_mib  # noqa: E402
from bench.scheduler_throughput import (  # noqa: E402
    BindWatch,
    cpu_seconds,
    install,
    parallel,
    scheduler_settings,
    start_replica,
)
from tests.support.cluster_product import lease_holder, make_certs  # noqa: E402
from tests.support.controlplane import HOST, ControlPlane, missing_parts, wait_until  # noqa: E402
from tests.support.kube_releases import RELEASES  # noqa: E402
from topoalloc.commands.installer.kustomize import build  # noqa: E402

WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
FIXTURE = REPO / "hw-fixtures" / "dgx1-v100" / "expected-device.yaml"
DEVICES = "/apis/scheduling.koordinator.sh/v1alpha1/devices"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
CAPACITY = {"cpu": "224", "memory": "2015Gi", "pods": "250"}
SHAPES = ("one", "pair", "one", "pair", "nic")  # 40% / 40% / 20%
SWITCH = "pcieSwitch"


class PhaseWatch(BindWatch):
    """BindWatch that also notes when each pod is first seen (created) and first seen without the
    DRA gate while unbound (ungated by topoalloc)."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.seen: dict[str, float] = {}
        self.ungated: dict[str, float] = {}
        self.gated: set[str] = set()
        self.allocated: dict[str, float] = {}  # claim name (= the pod's) -> first seen allocated
        super().__init__(cp, namespace)
        cp.watch(CLAIMS.format(ns=namespace), self._claim, self.stop, "claim-watch")

    def _claim(self, event: dict[str, Any]) -> None:
        obj = event.get("object") or {}
        name = (obj.get("metadata") or {}).get("name")
        if name and name not in self.allocated and (obj.get("status") or {}).get("allocation"):
            self.allocated[name] = time.monotonic()

    def _event(self, event: dict[str, Any]) -> None:
        obj = event.get("object") or {}
        name = (obj.get("metadata") or {}).get("name")
        if name:
            now = time.monotonic()
            self.seen.setdefault(name, now)
            spec = obj.get("spec") or {}
            gated = any(g.get("name") == dra.SCHEDULING_GATE for g in spec.get("schedulingGates") or ())
            if name not in self.ungated and not gated and not spec.get("nodeName") and name in self.gated:
                self.ungated[name] = now
            if gated:
                self.gated.add(name)
        super()._event(event)

    def phases(self) -> dict[str, float]:
        """Medians in seconds: first seen to allocated, to ungated and to bound; ungated to bound."""

        def med(pairs: list[float]) -> float:
            return statistics.median(pairs) if pairs else float("nan")

        return {
            "to_allocated_s": med(
                [self.allocated[n] - self.seen[n] for n in self.allocated if n in self.seen]
            ),
            "to_ungated_s": med([self.ungated[n] - self.seen[n] for n in self.ungated]),
            "ungated_to_bound_s": med(
                [self.bound[n] - self.ungated[n] for n in self.ungated if n in self.bound]
            ),
            "to_bound_s": med([self.bound[n] - self.seen[n] for n in self.bound if n in self.seen]),
        }


PARTS = ("kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager")
COMM = {name[:15]: name for name in PARTS}  # /proc/<pid>/comm keeps 15 characters


def parts_cpu() -> dict[str, float]:
    """CPU seconds so far of the control plane's processes by name (this machine's, all of them),
    and of this bench process (its client threads)."""
    out = dict.fromkeys(PARTS, 0.0)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            name = COMM.get((proc / "comm").read_text().strip())
            if name is not None:
                out[name] += cpu_seconds(int(proc.name))
        except OSError:
            continue  # gone meanwhile
    out["bench"] = cpu_seconds(os.getpid())
    return out


# kube-apiserver's own timings of topoalloc's path: (histogram, labels of the series) by name.
TIMED = {
    "webhook": ("apiserver_admission_webhook_admission_duration_seconds", ('name="dra.topoalloc.io"',)),
    "claim_status_patch": (
        "apiserver_request_duration_seconds",
        ('verb="PATCH"', 'resource="resourceclaims"', 'subresource="status"'),
    ),
    "pod_patch": (
        "apiserver_request_duration_seconds",
        ('verb="PATCH"', 'resource="pods"', 'subresource=""'),
    ),
}


def server_seconds(cp: ControlPlane) -> dict[str, tuple[float, float]]:
    """kube-apiserver's (sum of seconds, count) so far of each of TIMED, from one scrape."""
    out = dict.fromkeys(TIMED, (0.0, 0.0))
    for line in str(cp.admin.request("GET", "/metrics")).splitlines():
        for name, (metric, labels) in TIMED.items():
            if not all(label in line for label in labels):
                continue
            total, count = out[name]
            if line.startswith(metric + "_sum{"):
                out[name] = (total + float(line.rsplit(" ", 1)[1]), count)
            elif line.startswith(metric + "_count{"):
                out[name] = (total, count + float(line.rsplit(" ", 1)[1]))
    return out


# -- the world ---------------------------------------------------------------------------------------


def nvlinks(template: dict[str, Any]) -> dict[frozenset[str], int]:
    """NVLinks between each two GPUs of the machine, by device name."""
    out = {}
    for info in Device.from_dict(template).devices:
        if info.nvlink is not None:
            for peer in info.nvlink.peers:
                out[frozenset((f"gpu-{info.minor}", f"gpu-{peer.minor}"))] = peer.links
    return out


def register_nodes(cp: ControlPlane, count: int) -> dict[str, dict[str, Any]]:
    """N nodes in dra mode with their Devices and slices; the published attributes per device name
    (the same on every node: one machine type)."""
    template = yaml.safe_load(FIXTURE.read_text())
    labels = {**(template["metadata"].get("labels") or {}), dra.MODE_LABEL: dra.MODE_DRA}
    names = [f"dra-{i:05d}" for i in range(count)]
    attributes: dict[str, dict[str, Any]] = {}

    def one(name: str) -> None:
        node = cp.create_node(name, capacity=CAPACITY, labels=labels)
        device = json.loads(json.dumps(template))
        device["metadata"]["name"] = name
        cp.admin.post(DEVICES, device)
        devices = pool_devices(Device.from_dict(device), max_vfs=4)
        for s in pool_slices(name, devices, 1, node_uid=node["metadata"]["uid"]):
            cp.admin.post(SLICES, s)
        if not attributes:
            attributes.update(
                {d["name"]: {k: next(iter(v.values())) for k, v in d["attributes"].items()} for d in devices}
            )

    parallel(one, names)
    return attributes


def claim(name: str, shape: str, *, opted_out: bool) -> dict[str, Any]:
    gpu = {"name": "gpu", "exactly": {"deviceClassName": dra.GPU_CLASS, "count": 2 if shape == "pair" else 1}}
    devices: dict[str, Any] = {"requests": [gpu]}
    if shape == "nic":
        devices["requests"].append({"name": "nic", "exactly": {"deviceClassName": dra.RDMA_CLASS}})
        devices["constraints"] = [{"requests": ["gpu", "nic"], "matchAttribute": dra.qualified(SWITCH)}]
    meta: dict[str, Any] = {"name": name, "labels": {"shape": shape}}
    if opted_out:
        meta["annotations"] = {dra.ALLOCATOR_ANNOTATION: dra.ALLOCATOR_KUBE_SCHEDULER}
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": devices},
    }


def pod(name: str, claim_name: str) -> dict[str, Any]:
    requests = {"cpu": "1", "memory": "1Gi"}
    spec: dict[str, Any] = {
        "resourceClaims": [{"name": "devices", "resourceClaimName": claim_name}],
        "containers": [
            {
                "name": "c",
                "image": "cuda",
                "resources": {"requests": requests, "limits": requests, "claims": [{"name": "devices"}]},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def webhooks(cp: ControlPlane, port: int, certs: Path) -> None:
    """deploy/'s DRA webhooks (the pod gate, the claims' mark) calling the allocator directly."""
    config = next(d for d in build(REPO / "deploy") if d["kind"] == "MutatingWebhookConfiguration")
    ca = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
    config["webhooks"] = [h for h in config["webhooks"] if h["name"].endswith("dra.topoalloc.io")]
    for hook in config["webhooks"]:
        path = hook["clientConfig"]["service"].get("path", "/")
        hook["clientConfig"] = {"url": f"https://{HOST}:{port}{path}", "caBundle": ca}
    cp.admin.post(WEBHOOKS, config)


# -- one run ------------------------------------------------------------------------------------------


def one_run(
    cp: ControlPlane,
    pid: int,
    namespace: str,
    pods: int,
    mode: str,
    attributes: dict[str, dict[str, Any]],
    timeout: float,
) -> dict[str, float]:
    ours = mode == "topoalloc"
    cp.create_namespace(namespace)
    names = [f"p-{i:05d}" for i in range(pods)]
    parallel(
        lambda i: cp.admin.post(
            CLAIMS.format(ns=namespace), claim(names[i], SHAPES[i % len(SHAPES)], opted_out=not ours)
        ),
        list(range(pods)),
    )
    watch = PhaseWatch(cp, namespace)
    timed0 = server_seconds(cp)
    parts0 = parts_cpu()
    cpu0 = cpu_seconds(pid)
    try:
        t0 = time.monotonic()
        parallel(lambda n: cp.admin.post(f"/api/v1/namespaces/{namespace}/pods", pod(n, n)), names)
        created = time.monotonic() - t0  # every pod's creation answered (through the webhook)
        wait_until(
            lambda: len(watch.bound) >= pods, timeout=timeout, what=f"{pods} pods bound", interval=0.05
        )
        span = max(watch.bound.values()) - t0
        time.sleep(1.0)  # the allocator's last watch events of those pods
        cpu1 = cpu_seconds(pid)
        parts1 = parts_cpu()
        timed1 = server_seconds(cp)
    finally:
        watch.close()
    quality = measure(cp, namespace, attributes)
    events = cp.admin.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    reasons = Counter(e.get("reason") for e in events if str(e.get("reason", "")).startswith("DRA"))
    print(f"  {namespace} Events: {dict(sorted(reasons.items()))}", flush=True)
    delete(cp, namespace)
    timing = {"pods_per_s": pods / span, "created_s": created, "span_s": span}
    timing.update(watch.phases())
    for name in TIMED:  # mean milliseconds per call during the run
        n = timed1[name][1] - timed0[name][1]
        timing[f"{name}_ms"] = 1000 * (timed1[name][0] - timed0[name][0]) / n if n else float("nan")
    timing.update({f"cpu_{k}": parts1[k] - parts0[k] for k in parts0})
    timing["cpu_all"] = sum(timing[f"cpu_{k}"] for k in PARTS) + cpu1 - cpu0  # with the allocator
    return {**timing, "alloc_cpu_s": cpu1 - cpu0, "alloc_rss_mib": rss_mib(pid), **quality}


LINKS = nvlinks(yaml.safe_load(FIXTURE.read_text()))


def measure(cp: ControlPlane, namespace: str, attributes: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Shares of `pair` claims on one NVLink pair (the widest the machine has) and of `nic` claims
    on one switch."""
    widest = max(LINKS.values())
    kept = pairs = aligned = nics = 0
    for c in cp.admin.get(CLAIMS.format(ns=namespace))["items"]:
        devices = [r["device"] for r in c["status"]["allocation"]["devices"]["results"]]
        shape = c["metadata"]["labels"]["shape"]
        if shape == "pair":
            pairs += 1
            kept += LINKS.get(frozenset(devices), 0) == widest
        elif shape == "nic":
            nics += 1
            aligned += len({attributes[d].get(SWITCH) for d in devices}) == 1
    return {
        "kept": kept / pairs if pairs else float("nan"),
        "aligned": aligned / nics if nics else float("nan"),
    }


def delete(cp: ControlPlane, namespace: str) -> None:
    cp.admin.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", query={"gracePeriodSeconds": 0})
    wait_until(
        lambda: not cp.admin.get(f"/api/v1/namespaces/{namespace}/pods", limit=1)["items"],
        timeout=300,
        what=f"pods of {namespace} deleted",
    )
    # kube-scheduler's finalizer is taken off by kube-controller-manager, a few claims a second
    # (its client is throttled): take it off here, so the next run starts on empty nodes sooner.
    path = CLAIMS.format(ns=namespace)
    names = [c["metadata"]["name"] for c in cp.admin.get(path)["items"]]
    parallel(lambda n: cp.admin.merge_patch(f"{path}/{n}", {"metadata": {"finalizers": None}}), names)
    cp.admin.request("DELETE", path)
    wait_until(
        lambda: not cp.admin.get(CLAIMS.format(ns=namespace), limit=1)["items"],
        timeout=300,
        what=f"claims of {namespace} deleted",
    )


# -- the runs ------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, workdir: Path) -> int:
    certs = make_certs(workdir / "extender-pki")
    release = RELEASES[args.release]
    with ControlPlane(
        workdir / "k8s", scheduler=False, controller_manager=True, start_timeout=300, release=release
    ) as cp:
        replica = None
        try:
            install(cp)
            cp.kubectl("apply", "-k", str(REPO / "deploy" / "dra"))
            t0 = time.monotonic()
            attributes = register_nodes(cp, args.nodes)
            print(
                f"{args.nodes} dra-mode nodes (Node, Device, slices) in {time.monotonic() - t0:.0f} s",
                flush=True,
            )
            replica = start_replica(cp, certs, workdir, "bench-a", args.cprofile)
            replica.wait_ready(timeout=600)
            wait_until(lambda: lease_holder(cp) == "bench-a", timeout=60, what="bench-a leads")
            pid = replica.process.pid
            webhooks(cp, replica.webhook_port, certs)
            tables = []
            for qps in args.qps:
                cp.start_scheduler(scheduler_settings(qps, None, certs))
                results: dict[str, list[dict[str, float]]] = {m: [] for m in args.modes}
                if args.cprofile:
                    os.kill(pid, signal.SIGUSR1)
                for i in range(args.runs):
                    # ABBA: each mode goes first in every other pair, so a cluster that gets slower
                    # or faster over the runs favours neither.
                    for mode in args.modes if i % 2 == 0 else args.modes[::-1]:
                        load = load_average()
                        ns = f"q{qps}-run-{i}-{mode}"
                        r = one_run(cp, pid, ns, args.pods, mode, attributes, args.timeout)
                        results[mode].append(r)
                        print(
                            f"qps {qps} run {i} {mode:>14}: {r['pods_per_s']:7.1f} pods/s, NVLink pairs "
                            f"kept {100 * r['kept']:5.1f}%, GPU-NIC aligned {100 * r['aligned']:5.1f}%, "
                            f"allocator {1000 * r['alloc_cpu_s'] / args.pods:6.2f} ms CPU/pod (load {load}); "
                            f"created in {r['created_s']:.1f} s of {r['span_s']:.1f} s; pod webhook "
                            f"{r['webhook_ms']:.1f} ms/call; medians: to allocated "
                            f"{r['to_allocated_s']:.3f} s, to ungated {r['to_ungated_s']:.3f} s, "
                            f"ungated to bound {r['ungated_to_bound_s']:.3f} s, "
                            f"to bound {r['to_bound_s']:.3f} s; kube-apiserver's ms per claim status "
                            f"patch {r['claim_status_patch_ms']:.1f}, per pod patch {r['pod_patch_ms']:.1f}; "
                            "CPU s: " + " ".join(f"{k} {r['cpu_' + k]:.2f}" for k in (*PARTS, "bench")),
                            flush=True,
                        )
                if args.cprofile:
                    os.kill(pid, signal.SIGUSR2)
                    time.sleep(2)
                cp.stop_scheduler()
                tables.append((qps, results))
            for qps, results in tables:
                report(args, qps, results)
        finally:
            if replica is not None:
                replica.process.stop()
            cp.stop_scheduler()
    return 0


def report(args: argparse.Namespace, qps: int, results: dict[str, list[dict[str, float]]]) -> None:
    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[mode])

    print()
    print(f"{'mode':>14} {'nodes':>6} {'pods':>6} {'qps':>5} {'runs':>4} {'pods/s':>8} "
          f"{'NVLink pairs kept':>18} "
          f"{'GPU-NIC aligned':>16} {'alloc CPU ms/pod':>17} {'webhook ms':>10} {'to bound s':>10} "
          f"{'apiserver CPU s':>15} {'scheduler CPU s':>15} {'all CPU s':>9}")  # fmt: skip
    for mode in args.modes:
        print(f"{mode:>14} {args.nodes:>6} {args.pods:>6} {qps:>5} {args.runs:>4} "
              f"{med(mode, 'pods_per_s'):>8.1f} "
              f"{100 * med(mode, 'kept'):>17.1f}% {100 * med(mode, 'aligned'):>15.1f}% "
              f"{1000 * med(mode, 'alloc_cpu_s') / args.pods:>17.2f} {med(mode, 'webhook_ms'):>10.1f} "
              f"{med(mode, 'to_bound_s'):>10.3f} {med(mode, 'cpu_kube-apiserver'):>15.2f} "
              f"{med(mode, 'cpu_kube-scheduler'):>15.2f} {med(mode, 'cpu_all'):>9.2f}")  # fmt: skip
    if set(args.modes) == {"kube-scheduler", "topoalloc"}:
        runs = [
            t["pods_per_s"] / k["pods_per_s"]
            for t, k in zip(results["topoalloc"], results["kube-scheduler"], strict=True)
        ]
        ratio = med("topoalloc", "pods_per_s") / med("kube-scheduler", "pods_per_s")
        print(f"topoalloc / kube-scheduler pods/s: {ratio:.2f}x (goal >= 1x; kept and aligned: goal 100%)")
        print(f"  run by run (each pair's runs back to back): {', '.join(f'{r:.2f}' for r in runs)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=1, help="runs per mode, alternated")
    parser.add_argument(
        "--qps",
        type=int,
        nargs="+",
        default=[50, 1000],
        help="kube-scheduler's client qps (and burst), one table each (50: its default)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take")
    parser.add_argument(
        "--modes", nargs="+", choices=("kube-scheduler", "topoalloc"), default=["kube-scheduler", "topoalloc"]
    )
    parser.add_argument("--release", choices=sorted(RELEASES), default="1.35", help="Kubernetes release")
    parser.add_argument("--cprofile", metavar="OUT", help="run the allocator under cProfile (CPU time)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    missing = missing_parts(RELEASES[args.release])
    if missing:
        print("dra: skipped, this machine lacks " + "; ".join(missing))
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="topoalloc-dra-bench-"))
    print(f"work directory {workdir} (load {load_average()})", flush=True)
    try:
        return run(args, workdir)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
