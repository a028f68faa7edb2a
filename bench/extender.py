"""How fast the allocator answers kube-scheduler: filter + prioritize over HTTPS with mutual TLS
and one kept-alive connection, as kube-scheduler calls an extender with nodeCacheCapable (NodeNames).

kube-scheduler sends a nodeCacheCapable extender the nodes that passed its own filters, at most
its sample of `percentageOfNodesToScore` (default: 420 of 1,000 nodes, 500 of 5,000 or 10,000);
`--names all` sends every node instead (the worst case, `percentageOfNodesToScore: 100`).

For each cluster size the script seeds the fake API server (tests/support/fakeapi, in its own process)
with Nodes, Device CRs (half DGX H100, half 8x L40S; `--mix` picks other kinds, e.g. `dgx1-v100`,
where GPU sets are chosen by interconnect) and bound pods holding random load, starts
`topoalloc allocator` in its own process against it, waits until /readyz, then plays kube-scheduler
for a stream of pods of mixed shapes: filter with the sample's node names, prioritize with the
nodes that passed when more than one did (`--round-trips 1`: filter passes one), and bind to the best,
so every cycle changes one node as in a live cluster. Latency is measured at the client, from
sending the request to having read the reply.

Run: `.venv/bin/python bench/extender.py [--nodes 1000 5000 10000] [--pods 1000] [--names all]
[--mix dgx-h100,l40s]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import re
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from allocator.runtime import certs  # noqa: E402
from allocator.runtime.coreadapter import CoreAdapter, Rejection  # noqa: E402
from apis import keys  # noqa: E402
from tests.support.fakeapi import FakeApiServer  # noqa: E402
from tests.support.machines import machine_device  # noqa: E402

MACHINES = {
    "dgx-h100": {"cpu": "224", "memory": "2015Gi", "pods": "250", "nvidia.com/gpu": "8"},
    "l40s": {"cpu": "128", "memory": "1007Gi", "pods": "250", "nvidia.com/gpu": "8"},
    "dgx1-v100": {"cpu": "80", "memory": "512G", "pods": "250", "nvidia.com/gpu": "8"},
}
DEFAULT_MIX = ("dgx-h100", "l40s")
SHAPES: list[tuple[str, dict[str, str], dict[str, str]]] = [
    ("1 GPU", {"nvidia.com/gpu": "1", "cpu": "8", "memory": "64Gi"}, {}),
    ("2 GPUs", {"nvidia.com/gpu": "2", "cpu": "16", "memory": "128Gi"}, {}),
    ("4 GPUs", {"nvidia.com/gpu": "4", "cpu": "32", "memory": "256Gi"}, {}),
    ("8 GPUs", {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi"}, {}),
    ("half GPU", {"koordinator.sh/gpu": "50", "cpu": "4", "memory": "16Gi"}, {}),
    (
        "4 GPUs + VFs",
        {"nvidia.com/gpu": "4", "koordinator.sh/rdma": "1", "cpu": "32", "memory": "256Gi"},
        {
            keys.DEVICE_ALLOCATE_HINT: '{"rdma":{"vfSelector":{}}}',
            keys.DEVICE_JOINT_ALLOCATE: '{"deviceTypes":["gpu","rdma"],"requiredScope":"SamePCIe"}',
        },
    ),
]


def pod(
    name: str, requests: dict[str, str], annotations: dict[str, str], node: str | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "bench"}
    if annotations:
        meta["annotations"] = dict(annotations)
    spec: dict[str, Any] = {
        "containers": [
            {"name": "c", "image": "cuda", "resources": {"requests": requests, "limits": requests}}
        ]
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def seed(
    fake: FakeApiServer, nodes: int, rng: random.Random, mix: tuple[str, ...] = DEFAULT_MIX
) -> list[str]:
    """Nodes (the machine kinds of `mix` in turn), Devices and bound pods with random load,
    allocated by the real core."""
    fake.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
    core = CoreAdapter()
    names = []
    for i in range(nodes):
        kind = mix[i % len(mix)]
        name = f"{kind}-{i:05d}"  # as names_of() spells it
        device = machine_device(kind, name)
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, **device["metadata"]["labels"]},
            },
            "status": {"capacity": MACHINES[kind], "allocatable": MACHINES[kind]},
        }
        fake.put(node)
        fake.put(device)
        core.set_node(node)
        core.set_device(device)
        names.append(name)
        for j in range(rng.choice((0, 1, 1, 2, 3))):
            _label, requests, annotations = rng.choice(SHAPES[:5])
            p = pod(f"load-{i}-{j}", requests, annotations, node=name)
            req = core.request(p)
            got = core.allocate(req, name)
            if isinstance(got, Rejection):
                continue
            p["metadata"]["annotations"] = {**annotations, keys.DEVICE_ALLOCATED: got.to_json()}
            core.assign_reservation(f"bench/{p['metadata']['name']}", name, got, req)
            fake.put(p)
    return names


def pki(directory: Path) -> ssl.SSLContext:
    ca = certs.make_ca("bench-ca")
    ca.write(directory / "ca.crt", directory / "ca.key")
    certs.issue(ca, "allocator", dns_names=["localhost"], ip_addresses=["127.0.0.1"], server=True).write(
        directory / "tls.crt", directory / "tls.key"
    )
    certs.scheduler_client_cert(ca).write(directory / "client.crt", directory / "client.key")
    ctx = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    ctx.load_cert_chain(directory / "client.crt", directory / "client.key")
    return ctx


def start_allocator(
    url: str, directory: Path, round_trips: int = 2
) -> tuple[subprocess.Popen[bytes], int, int]:
    proc = subprocess.Popen(
        # BENCH_PROFILE="-m cProfile -o /tmp/allocator.prof" profiles the allocator process.
        [sys.executable, *os.environ.get("BENCH_PROFILE", "").split(), "-m", "topoalloc", "allocator", "-v",
         "--api-server", url, "--no-leader-elect", "--no-events", "--host", "127.0.0.1", "--port", "0",
         "--health-host", "127.0.0.1", "--health-port", "0",
         "--webhook-host", "127.0.0.1", "--webhook-port", "0",
         "--tls-cert", str(directory / "tls.crt"), "--tls-key", str(directory / "tls.key"),
         "--client-ca", str(directory / "ca.crt"), "--round-trips", str(round_trips)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip
    assert proc.stderr is not None
    pattern = re.compile(
        rb"extender on https://127\.0\.0\.1:(\d+), health and metrics on http://127\.0\.0\.1:(\d+)"
    )
    for line in proc.stderr:
        found = pattern.search(line)
        if found:
            # Keep draining the log so the process never blocks on a full pipe.
            import threading

            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
            return proc, int(found.group(1)), int(found.group(2))
    raise RuntimeError("allocator did not start")


async def wait_ready(health: int, timeout: float = 600) -> float:
    start = time.monotonic()
    async with aiohttp.ClientSession() as s:
        while time.monotonic() - start < timeout:
            try:
                async with s.get(f"http://127.0.0.1:{health}/readyz") as r:
                    if r.status == 200:
                        return time.monotonic() - start
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError("allocator not ready")


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def names_of(nodes: int, mix: tuple[str, ...] = DEFAULT_MIX) -> list[str]:
    return [f"{mix[i % len(mix)]}-{i:05d}" for i in range(nodes)]


def sample_size(nodes: int) -> int:
    """How many feasible nodes kube-scheduler looks for (and sends to a nodeCacheCapable extender)
    with the default percentageOfNodesToScore: 50% minus 1% per 125 nodes, at least 5%, at least
    100 nodes (kube-scheduler's numFeasibleNodesToFind)."""
    if nodes < 100:
        return nodes
    percent = max(5, 50 - nodes // 125)
    return max(100, nodes * percent // 100)


class NodeSample:
    """The node names of each filter call: all of them, or kube-scheduler's sample, a window that
    starts where the previous one ended (its nextStartNodeIndex)."""

    def __init__(self, names: list[str], mode: str) -> None:
        self.names = names
        self.size = len(names) if mode == "all" else sample_size(len(names))
        self.start = 0

    def next(self) -> list[str]:
        if self.size >= len(self.names):
            return self.names
        end = self.start + self.size
        window = self.names[self.start : end]
        if end > len(self.names):
            window += self.names[: end - len(self.names)]
        self.start = end % len(self.names)
        return window


async def play_scheduler(
    api: str, port: int, ctx: ssl.SSLContext, names: NodeSample, pods: int, rng: random.Random, prefix: str
) -> dict[str, list[float]]:
    url = f"https://127.0.0.1:{port}"
    timings: dict[str, list[float]] = defaultdict(list)
    connector = aiohttp.TCPConnector(ssl=ctx, limit=1)  # one kept-alive connection, like kube-scheduler
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Go-http-client/1.1",
        "Accept-Encoding": "gzip",
    }
    async with (
        aiohttp.ClientSession(connector=connector, headers=headers) as session,
        aiohttp.ClientSession() as k8s,
    ):

        async def call(verb: str, body: Any) -> tuple[float, Any]:
            # Timed: the HTTPS round trip and the allocator's work, not this client's JSON.
            data = json.dumps(body, separators=(",", ":")).encode()
            start = time.perf_counter()
            async with session.post(f"{url}/{verb}", data=data) as resp:
                raw = await resp.read()
            elapsed = time.perf_counter() - start
            assert resp.status == 200, raw[:200]
            server = dict(part.strip().split(";dur=") for part in resp.headers["Server-Timing"].split(","))
            timings[f"{verb} (in allocator)"].append(float(server["app"]) / 1000)
            timings[f"{verb} (allocator CPU)"].append(float(server["cpu"]) / 1000)
            return elapsed, json.loads(raw)

        for i in range(pods):
            _label, requests, annotations = SHAPES[i % len(SHAPES)]
            # The pod kube-scheduler is placing, created through the API like any pod.
            async with k8s.post(
                f"{api}/api/v1/namespaces/bench/pods", json=pod(f"{prefix}-{i}", requests, annotations)
            ) as r:
                assert r.status == 201, await r.text()
                p = await r.json()
            t, result = await call("filter", {"Pod": p, "Nodes": None, "NodeNames": names.next()})
            timings["filter"].append(t)
            passed = result["NodeNames"]
            timings["passed"].append(len(passed))
            if not passed:
                continue
            target = passed[0]
            if len(passed) > 1:  # as kube-scheduler: one node passed is placed without scoring
                t2, scores = await call("prioritize", {"Pod": p, "Nodes": None, "NodeNames": passed})
                timings["prioritize"].append(t2)
                t += t2
                best = max(s["Score"] for s in scores)
                target = rng.choice([s["Host"] for s in scores if s["Score"] == best])
            timings["decision"].append(t)
            meta = p["metadata"]
            t, bound = await call("bind", {"PodName": meta["name"], "PodNamespace": "bench",
                                           "PodUID": meta["uid"], "Node": target})  # fmt: skip
            timings["bind"].append(t)
            assert bound["Error"] == "", bound
    return timings


VERBS = (
    "filter",
    "filter (in allocator)",
    "filter (allocator CPU)",
    "prioritize",
    "prioritize (in allocator)",
    "prioritize (allocator CPU)",
    "bind",
)


def row(nodes: int, label: str, values: list[float]) -> tuple[Any, ...]:
    """nodes, label, count, p50 ms, p99 ms, max ms, calls/s one after another."""
    p50, p99 = 1000 * statistics.median(values), 1000 * pct(values, 0.99)
    return (nodes, label, len(values), p50, p99, 1000 * max(values), len(values) / sum(values))


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def serve_fake(nodes: int, seed_value: int, conn: Any, mix: tuple[str, ...] = DEFAULT_MIX) -> None:
    """The fake API server in its own process, so its work does not share the client's GIL."""

    async def serve() -> None:
        async with FakeApiServer(default_watch_timeout=1800.0, history_limit=200_000) as fake:
            start = time.perf_counter()
            seed(fake, nodes, random.Random(seed_value), mix)
            conn.send((fake.url, time.perf_counter() - start))
            await asyncio.Event().wait()

    asyncio.run(serve())


async def run(
    nodes: int,
    pods: int,
    seed_value: int,
    mix: tuple[str, ...] = DEFAULT_MIX,
    mode: str = "scheduler",
    round_trips: int = 2,
) -> list[tuple[Any, ...]]:
    rng = random.Random(seed_value)
    parent, child = multiprocessing.Pipe()
    fake_proc = multiprocessing.Process(target=serve_fake, args=(nodes, seed_value, child, mix), daemon=True)
    fake_proc.start()
    try:
        url, seeded = parent.recv()
        with tempfile.TemporaryDirectory() as tmp:
            ctx = pki(Path(tmp))
            proc, port, health = start_allocator(url, Path(tmp), round_trips)
            try:
                synced = await wait_ready(health)
                print(
                    f"{nodes} nodes: seeded in {seeded:.1f} s, allocator ready in {synced:.1f} s", flush=True
                )
                # Warm-up: the first pod of each shape fills the core's per-node caches.
                sample = NodeSample(names_of(nodes, mix), mode)
                await play_scheduler(url, port, ctx, sample, len(SHAPES) * 2, rng, "warm")
                start = time.perf_counter()
                timings = await play_scheduler(url, port, ctx, sample, pods, rng, "p")
                wall = time.perf_counter() - start
                rss = rss_mib(proc.pid)
            finally:
                proc.terminate()
                proc.wait(30)
    finally:
        fake_proc.terminate()
        fake_proc.join(10)
    rows = [row(nodes, verb, timings[verb]) for verb in VERBS if timings[verb]]
    rows.append(
        row(nodes, "filter+prioritize" if round_trips == 2 else "filter (one trip)", timings["decision"])
    )
    median_passed = statistics.median(timings["passed"])
    print(f"   {pods} pods in {wall:.1f} s; nodes per filter call {sample.size}, passing: median "
          f"{median_passed:.0f}; allocator RSS {rss:.0f} MiB, every pod cached "
          f"(load {load_average()})")  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument(
        "--pods", type=int, default=1000, help="pods scheduled per cluster size (after warm-up)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--names",
        choices=("scheduler", "all"),
        default="scheduler",
        help="node names per filter call: kube-scheduler's default sample, or every node (worst case)",
    )
    parser.add_argument(
        "--mix",
        default=",".join(DEFAULT_MIX),
        help=f"machine kinds in turn, from {', '.join(MACHINES)} (dgx1-v100: sets chosen by interconnect)",
    )
    parser.add_argument(
        "--round-trips",
        type=int,
        choices=(1, 2),
        default=2,
        help="the allocator's mode: 2 filter + prioritize (the decision is both), 1 filter alone",
    )
    args = parser.parse_args(argv)
    mix = tuple(k.strip() for k in args.mix.split(",") if k.strip())
    if not mix or any(k not in MACHINES for k in mix):
        parser.error(f"--mix: expected kinds from {', '.join(MACHINES)}")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    rows = []
    for n in args.nodes:
        rows.extend(asyncio.run(run(n, args.pods, args.seed, mix, args.names, args.round_trips)))
    print()
    print(f"{'nodes':>6}  {'call':<26} {'count':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'calls/s':>8}")
    for nodes, verb, count, p50, p99, worst, rate in rows:
        print(f"{nodes:>6}  {verb:<26} {count:>6} {p50:>8.2f} {p99:>8.2f} {worst:>8.2f} {rate:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
