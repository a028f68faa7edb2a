"""What active Reservations cost kube-scheduler's calls: filter + prioritize p99 with and without them.

The same cluster twice (bench/extender.py's: Nodes, Device CRs, bound pods with random load, the
fake API server in its own process, `topoalloc allocator` in its own), once as it is and once with
`--reservations` Reservations already placed on it (Available, their devices written, one or two
GPUs each plus cpu and memory, spread over the nodes; placed by the real core on the seeded load).
A third run holds the same devices, cpu and memory with plain bound pods instead, so the cost of
the Reservations themselves shows apart from the cost of a fuller cluster. Then kube-scheduler is
played for the same stream of pods in each: filter with the sample's node names, prioritize the
nodes that passed, bind to the best. The pods own no reservation, which is
what nearly every pod in a cluster is; `--owners` plays as many owner pods more (each labelled for
one room) and reports them on their own rows.

On a machine shared with other work the wall and CPU p99 of separate processes move by tens of
percent from run to run; the last table is free of that: in one process, on the seeded cluster with
its Reservations, the core's own filter and prioritize of each pod beside what the Reservations add
to the same call (owner lookup, the rooms' cpu and memory check, steering), per call.

The design target (issue 28): filter and prioritize p99 at 1,000 nodes with 1,000 active
Reservations within 20% of without. Run: `.venv/bin/python bench/reservations.py [--nodes 1000]
[--reservations 1000] [--pods 1000] [--owners 200]`.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from allocator.runtime.coreadapter import CoreAdapter, Rejection  # noqa: E402
from apis import keys  # noqa: E402
from apis import reservation as rv  # noqa: E402
from bench import extender as ex  # noqa: E402
from tests.support.fakeapi import FakeApiServer  # noqa: E402

ROWS = (
    "filter", "filter (allocator CPU)", "prioritize", "prioritize (allocator CPU)", "filter+prioritize",
)  # fmt: skip


def core_of(fake: FakeApiServer) -> CoreAdapter:
    """The seeded cluster as the allocator's core counts it."""
    core = CoreAdapter()
    for node in fake.list_objects("nodes"):
        core.set_node(node)
    for device in fake.list_objects("devices"):
        core.set_device(device)
    for pod in fake.list_objects("pods", "bench"):
        usage = core.usage(pod)
        if usage.node:
            core.assign_usage(usage.key, usage.node, usage)
    return core


def reservation(name: str, gpus: int) -> dict[str, Any]:
    requests = {"nvidia.com/gpu": str(gpus), "cpu": str(4 * gpus), "memory": f"{32 * gpus}Gi"}
    return {
        "apiVersion": rv.API_VERSION,
        "kind": rv.KIND,
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {
            "template": {
                "metadata": {"namespace": "bench"},
                "spec": {
                    "containers": [{"name": "c", "resources": {"requests": requests, "limits": requests}}]
                },
            },
            "owners": [{"labelSelector": {"matchLabels": {"reservation": name}}}],
            "ttl": "0",
        },
    }


def place_reservations(fake: FakeApiServer, count: int, rng: random.Random, *, as_pods: bool = False) -> int:
    """`count` Reservations placed on the seeded nodes by the real core, written Available; with
    `as_pods`, the same devices, cpu and memory held by plain bound pods instead (the same load
    without Reservations)."""
    core = core_of(fake)
    names = sorted(core.cluster.nodes)
    placed = 0
    for i in range(count * 3):
        if placed == count:
            break
        body = reservation(f"r-{i:05d}", rng.choice((1, 1, 2)))
        template = {"metadata": {"name": body["metadata"]["name"], "namespace": "bench", "uid": f"t-{i}"},
                    "spec": body["spec"]["template"]["spec"]}  # fmt: skip
        req = core.request(template)
        node = names[i % len(names)]
        got = core.allocate(req, node)
        if isinstance(got, Rejection):
            continue
        core.assign_reservation(f"reservation:{body['metadata']['name']}", node, got, req)
        if as_pods:
            holder = ex.pod(
                f"held-{i:05d}",
                body["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"],
                {},
                node,
            )
            holder["metadata"]["annotations"] = {keys.DEVICE_ALLOCATED: got.to_json()}
            fake.put(holder)
        else:
            body["metadata"]["annotations"] = {keys.DEVICE_ALLOCATED: got.to_json()}
            body["status"] = {"phase": rv.AVAILABLE, "nodeName": node}
            fake.put(body)
        placed += 1
    return placed


def serve(nodes: int, count: int, seed_value: int, conn: Any, as_pods: bool = False) -> None:
    async def run() -> None:
        async with FakeApiServer(default_watch_timeout=1800.0, history_limit=200_000) as fake:
            rng = random.Random(seed_value)
            ex.seed(fake, nodes, rng)
            placed = place_reservations(fake, count, rng, as_pods=as_pods) if count else 0
            conn.send((fake.url, placed))
            await asyncio.Event().wait()

    asyncio.run(run())


async def owners(
    url: str, port: int, ctx: Any, sample: ex.NodeSample, count: int, rng: random.Random
) -> dict[str, list[float]]:
    """Pods that own a room: filter and prioritize steered to it (no bind: the room stays)."""
    import aiohttp

    timings: dict[str, list[float]] = {}
    connector = aiohttp.TCPConnector(ssl=ctx, limit=1)
    async with aiohttp.ClientSession(connector=connector) as session, aiohttp.ClientSession() as k8s:
        for i in range(count):
            p = ex.pod(f"owner-{i}", {"nvidia.com/gpu": "1", "cpu": "4", "memory": "32Gi"}, {})
            p["metadata"]["labels"] = {"reservation": f"r-{rng.randrange(count):05d}"}
            async with k8s.post(f"{url}/api/v1/namespaces/bench/pods", json=p) as r:
                p = await r.json()
            for verb in ("filter", "prioritize"):
                body = {"Pod": p, "Nodes": None, "NodeNames": sample.next()}
                start = time.perf_counter()
                async with session.post(f"https://127.0.0.1:{port}/{verb}", json=body) as resp:
                    await resp.read()
                timings.setdefault(f"owner {verb}", []).append(time.perf_counter() - start)
    return timings


async def measure(
    nodes: int, count: int, pods: int, owner_pods: int, seed_value: int, as_pods: bool = False
) -> tuple[list[tuple[Any, ...]], int]:
    parent, child = multiprocessing.Pipe()
    fake_proc = multiprocessing.Process(
        target=serve, args=(nodes, count, seed_value, child, as_pods), daemon=True
    )
    fake_proc.start()
    try:
        url, placed = parent.recv()
        with tempfile.TemporaryDirectory() as tmp:
            ctx = ex.pki(Path(tmp))
            proc, port, health = ex.start_allocator(url, Path(tmp))
            try:
                await ex.wait_ready(health)
                rng = random.Random(seed_value)
                sample = ex.NodeSample(ex.names_of(nodes), "scheduler")
                await ex.play_scheduler(url, port, ctx, sample, len(ex.SHAPES) * 2, rng, "warm")
                timings = await ex.play_scheduler(url, port, ctx, sample, pods, rng, "p")
                if owner_pods and placed:
                    timings.update(await owners(url, port, ctx, sample, owner_pods, rng))
            finally:
                proc.terminate()
                proc.wait(30)
    finally:
        fake_proc.terminate()
        fake_proc.join(10)
    label = "none" if not count else f"{placed} as pods" if as_pods else f"{placed} reservations"
    rows = [
        (label, *ex.row(nodes, verb, timings[verb])[1:])
        for verb in (*ROWS, "owner filter", "owner prioritize")
        if timings.get(verb)
    ]
    return rows, placed


async def in_process(nodes: int, count: int, pods: int, seed_value: int) -> list[tuple[str, list[float]]]:
    """The core's filter/prioritize per pod and what Reservations add to each, in this process."""
    from allocator.reservations.hooks import ReservationScheduling
    from allocator.runtime.cache.store import ClusterCache
    from allocator.runtime.events import NullEvents
    from allocator.runtime.gang_settings import GangSettings
    from allocator.runtime.kube import DEVICES, NODES, PODS, RESERVATIONS
    from allocator.runtime.reservation_settings import ReservationSettings
    from allocator.runtime.topology import Topology

    async with FakeApiServer() as fake:
        rng = random.Random(seed_value)
        ex.seed(fake, nodes, rng)
        place_reservations(fake, count, rng)
        core = CoreAdapter()
        cache = ClusterCache(core)
        rooms = ReservationScheduling(
            ReservationSettings(), api=None, cache=cache, core=core,  # type: ignore[arg-type]
            events=NullEvents(), is_leader=lambda: True, synced=lambda: True,
            topology=Topology(GangSettings(), cache),
        )  # fmt: skip
        cache.listeners.append(rooms.observe)
        for kind, namespace in ((NODES, None), (DEVICES, None), (RESERVATIONS, None), (PODS, "bench")):
            cache.replace(kind, fake.list_objects(kind.plural, namespace))
        names = ex.names_of(nodes)
        sample = ex.NodeSample(names, "scheduler")
        timings: dict[str, list[float]] = {
            k: [] for k in ("core filter", "+ reservations", "core prioritize", "+ reservations ")
        }
        for i in range(pods):
            _label, requests, annotations = ex.SHAPES[i % len(ex.SHAPES)]
            pod = ex.pod(f"in-{i}", requests, annotations)
            pod["metadata"].update(uid=f"in-{i}", resourceVersion="1")
            req = core.request(pod)
            core.cluster.nodes[names[i % nodes]]._changed()  # as a bind before it changed one node
            window = sample.next()
            t0 = time.perf_counter()
            core.filter_nodes(req, window)
            t1 = time.perf_counter()
            rooms.filter(pod, req, window)
            t2 = time.perf_counter()
            scores = core.score_nodes(req, window)
            t3 = time.perf_counter()
            rooms.scores(pod, req, window, scores)
            t4 = time.perf_counter()
            for key, value in zip(timings, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                timings[key].append(value)
        return list(timings.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--reservations", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--owners", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each, alternating; the table shows the median run"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    kinds = ("none", "as pods", "reservations")
    runs: dict[str, list[list[tuple[Any, ...]]]] = {k: [] for k in kinds}
    placed = 0
    for _ in range(max(1, args.repeat)):  # alternating, so all see the same machine load
        runs["none"].append(asyncio.run(measure(args.nodes, 0, args.pods, 0, args.seed))[0])
        held = asyncio.run(measure(args.nodes, args.reservations, args.pods, 0, args.seed, as_pods=True))
        runs["as pods"].append(held[0])
        rows, placed = asyncio.run(measure(args.nodes, args.reservations, args.pods, args.owners, args.seed))
        runs["reservations"].append(rows)
    table = {k: _median_rows(v) for k, v in runs.items()}
    print(f"\n{args.nodes} nodes, {args.pods} pods, median of {args.repeat} runs, load {ex.load_average()}")
    head = f"{'reservations':<18} {'call':<26} {'count':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
    print(head + f" {'calls/s':>8}")
    for rows in table.values():
        for label, verb, count, p50, p99, worst, rate in rows:
            print(f"{label:<18} {verb:<26} {count:>6} {p50:>8.2f} {p99:>8.2f} {worst:>8.2f} {rate:>8.0f}")
    print()
    print(f"\nin one process, {args.reservations} reservations, {args.pods} pods (ms per call):")
    for label, values in asyncio.run(in_process(args.nodes, args.reservations, args.pods, args.seed)):
        p50, p99 = 1000 * statistics.median(values), 1000 * ex.pct(values, 0.99)
        print(f"  {label:<18} p50 {p50:6.3f}  p99 {p99:6.3f}")
    for baseline in ("none", "as pods"):
        base = {verb: p99 for _, verb, _, _, p99, _, _ in table[baseline]}
        what = "no reservations" if baseline == "none" else "the same devices held by plain pods"
        print(f"p99 with {placed} reservations against {what} (target: within +20%):")
        for _, verb, _, _, p99, _, _ in table["reservations"]:
            if verb in base:
                print(f"  {verb:<26} {100 * (p99 / base[verb] - 1):+.0f}%")
    return 0


def _median_rows(runs: list[list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    """Per call, the row of the run with the median p99."""
    out = []
    for i, row in enumerate(runs[0]):
        same = sorted((r[i] for r in runs if i < len(r) and r[i][1] == row[1]), key=lambda r: r[4])
        out.append(same[len(same) // 2])
    return out


if __name__ == "__main__":
    sys.exit(main())
