"""Fuzz campaign: generated bad input against the running extender and the decoders, counting
crashes, 5xx answers and hangs (issue 18).

Extender: the fake API server (tests/support/fakeapi) in its own process with a small cluster of
DGX H100 and 8x L40S nodes under random load, `topoalloc allocator` in its own process against it,
certificates minted for the run, and real HTTPS with mutual TLS on 127.0.0.1. Each input is one
filter, prioritize or bind call whose pod carries drawn amounts (fractional, negative,
overflowing, not numbers) and drawn or mangled annotations, and a few per cent are broken bodies
(mutated trees, flipped bytes, truncations). A 5xx, a dropped connection or a reply later than
--timeout counts against it; so does a filter reply that leaves an offered node neither passed
nor explained.

Decoders, in this process: Device CRs with changed fields (apis.device and the core's inventory),
pods (the core's request parser, which must never raise), each pod annotation's parser, extender
request bodies, quantities, and the bytes of files a user hands the CLI (apis.documents). A
decoder may refuse an input only with its documented error (CodecError, InputError); anything else
is a crash, and a call slower than 1 s a hang.

Run: `.venv/bin/python bench/fuzz.py [--http 100000] [--decoders 100000] [--seed 1]` (`make fuzz`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import ssl
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from allocator.core.node.inventory import build_inventory  # noqa: E402
from allocator.core.request.parse import pod_request  # noqa: E402
from apis import annotations as ann  # noqa: E402
from apis.device import Device  # noqa: E402
from apis.documents import decode_text, parse_yaml_documents, single_object  # noqa: E402
from apis.errors import CodecError, InputError  # noqa: E402
from apis.extender import ExtenderArgs  # noqa: E402
from apis.podresources import resource_quantity  # noqa: E402
from bench import extender as ext  # noqa: E402
from tests.support import fuzzing as fz  # noqa: E402
from tests.support.machines import machine_device  # noqa: E402

HANG_SECONDS = 1.0


@dataclass
class Tally:
    inputs: int = 0
    accepted: int = 0
    rejected: int = 0
    crashes: int = 0
    server_errors: int = 0
    hangs: int = 0
    unexplained: int = 0
    worst: float = 0.0
    examples: list[str] = field(default_factory=list)

    def bad(self, what: str) -> None:
        if len(self.examples) < 3:
            self.examples.append(what[:300])


# -- decoders ------------------------------------------------------------------------------------


def decoder_targets(rng: random.Random) -> list[tuple[str, Callable[[], Any]]]:
    base = machine_device("dgx-h100", "fuzz-node")
    parsers = [
        (ann.parse_device_allocate_hint, fz.HINTS),
        (ann.parse_device_joint_allocate, fz.JOINTS),
        (ann.parse_gpu_partition_spec, fz.PARTITIONS),
        (ann.parse_numa_topology_spec, fz.NUMAS),
        (ann.parse_device_allocated, fz.ALLOCATED),
    ]

    def annotation() -> Any:
        parse, good = rng.choice(parsers)
        return parse(fz.mutate_string(rng, rng.choice(good)))

    def request() -> Any:
        req = pod_request(fz.pod(rng))  # never raises; an invalid pod says why
        if req.invalid is not None and not req.invalid.message:
            raise AssertionError("invalid request without a message")
        return req

    def quantity() -> Any:
        return resource_quantity(rng.choice(fz.RESOURCE_NAMES), rng.choice(fz.AMOUNTS), "q")

    def document() -> Any:
        data = fz.document_bytes(rng, lambda: fz.pod(rng))
        return single_object(
            parse_yaml_documents(decode_text(data, "pod file", "f"), "pod file", "f"), "pod file", "f", "Pod"
        )

    def args() -> Any:
        body = {"Pod": fz.pod(rng), "Nodes": None, "NodeNames": ["a", "b"]}
        return ExtenderArgs.from_dict(fz.mutate_tree(rng, body, rounds=rng.randint(0, 3)))

    return [
        ("Device CR (apis.device)", lambda: Device.from_dict(fz.device(rng, base))),
        ("Device CR (core inventory)", lambda: build_inventory(fz.device(rng, base))),
        ("pod request (core)", request),
        ("pod annotations", annotation),
        ("extender args", args),
        ("request quantities", quantity),
        ("CLI file bytes", document),
    ]


def fuzz_decoders(count: int, seed: int, progress: bool = True) -> dict[str, Tally]:
    rng = random.Random(seed)
    targets = decoder_targets(rng)
    tallies = {name: Tally() for name, _ in targets}
    for i in tqdm(range(count), desc="decoders", unit="input", disable=not progress, mininterval=1):
        name, fn = targets[i % len(targets)]
        tally = tallies[name]
        tally.inputs += 1
        start = time.perf_counter()
        try:
            fn()
            tally.accepted += 1
        except (CodecError, InputError):
            tally.rejected += 1
        except Exception as exc:  # anything else is a crash: the decoder's contract is broken
            tally.crashes += 1
            tally.bad(f"{type(exc).__name__}: {exc}")
        elapsed = time.perf_counter() - start
        tally.worst = max(tally.worst, elapsed)
        if elapsed > HANG_SECONDS:
            tally.hangs += 1
    return tallies


# -- the running extender ------------------------------------------------------------------------


async def fuzz_extender(
    count: int, seed: int, nodes: int, connections: int, timeout: float, progress: bool = True
) -> tuple[dict[str, Tally], bool]:
    parent, child = multiprocessing.Pipe()
    fake = multiprocessing.Process(target=_serve_fake_quietly, args=(nodes, seed, child), daemon=True)
    fake.start()
    try:
        url, _seeded = parent.recv()
        with tempfile.TemporaryDirectory() as tmp:
            ctx = ext.pki(Path(tmp))
            proc, port, health = ext.start_allocator(url, Path(tmp))
            try:
                await ext.wait_ready(health)
                bar = tqdm(total=count, desc="extender", unit="call", disable=not progress, mininterval=1)
                with bar:
                    tallies = await _campaign(
                        count, seed, ext.names_of(nodes), port, ctx, connections, timeout, bar.update
                    )
                alive = proc.poll() is None and await _still_answers(port, health, ctx, ext.names_of(nodes))
            finally:
                proc.terminate()
                proc.wait(30)
    finally:
        fake.terminate()
        fake.join(10)
    return tallies, alive


def _serve_fake_quietly(nodes: int, seed: int, conn: Any) -> None:
    """The fake API server, without aiohttp's log of the odd URLs the fuzzed pod names make (a
    real kube-apiserver refuses them too; the allocator reports that as the bind's error)."""
    import logging

    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    ext.serve_fake(nodes, seed, conn)


async def _campaign(
    count: int,
    seed: int,
    names: list[str],
    port: int,
    ctx: ssl.SSLContext,
    connections: int,
    timeout: float,
    tick: Callable[[int], object],
) -> dict[str, Tally]:
    tallies = {f"extender {verb} (HTTPS)": Tally() for verb in ("filter", "prioritize", "bind")}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)
    headers = {"Content-Type": "application/json", "User-Agent": "Go-http-client/1.1"}

    async def worker(w: int) -> None:
        rng = random.Random(seed * 1000 + w)
        connector = aiohttp.TCPConnector(ssl=ctx, limit=1)
        async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
            while not queue.empty():
                i = queue.get_nowait()
                pod = fz.pod(rng, name=f"fz-{i}")
                verb, body = fz.extender_body(rng, pod, names)
                tally = tallies[f"extender {verb} (HTTPS)"]
                tally.inputs += 1
                tick(1)
                start = time.perf_counter()
                try:
                    async with asyncio.timeout(timeout):
                        async with session.post(f"https://127.0.0.1:{port}/{verb}", data=body) as resp:
                            raw = await resp.read()
                except TimeoutError:
                    tally.hangs += 1
                    tally.bad(f"{verb} hung: {body[:200]!r}")
                    continue
                except aiohttp.ClientError as exc:
                    tally.crashes += 1
                    tally.bad(f"{verb}: {type(exc).__name__}: {exc}")
                    continue
                finally:
                    tally.worst = max(tally.worst, time.perf_counter() - start)
                if resp.status >= 500:
                    tally.server_errors += 1
                    tally.bad(f"{verb} {resp.status}: {raw[:200]!r} for {body[:200]!r}")
                elif resp.status == 200:
                    tally.accepted += 1
                    if verb == "filter":
                        _check_filter(tally, body, raw)
                else:
                    tally.rejected += 1

    await asyncio.gather(*(worker(w) for w in range(connections)))
    return tallies


def _check_filter(tally: Tally, body: bytes, raw: bytes) -> None:
    """Every offered node is passed or explained (kube-scheduler shows the reasons)."""
    sent = json.loads(body)
    offered = sent.get("NodeNames")
    if not isinstance(offered, list):
        return
    reply = json.loads(raw)
    explained = set(reply.get("NodeNames") or []) | set(reply.get("FailedNodes") or {})
    explained |= set(reply.get("FailedAndUnresolvableNodes") or {})
    missing = fz.as_go_reads(offered) - explained
    if missing:
        tally.unexplained += 1
        tally.bad(f"filter left {sorted(missing)[:3]} unexplained")


async def _still_answers(port: int, health: int, ctx: ssl.SSLContext, names: list[str]) -> bool:
    good = {"Pod": ext.pod("after", {"nvidia.com/gpu": "1"}, {}), "Nodes": None, "NodeNames": names}
    good["Pod"]["metadata"]["uid"] = "after"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        async with session.get(f"http://127.0.0.1:{health}/readyz", ssl=False) as r:
            if r.status != 200:
                return False
        async with session.post(f"https://127.0.0.1:{port}/filter", json=good) as r:
            return r.status == 200 and bool((await r.json())["NodeNames"])


# -- report --------------------------------------------------------------------------------------


def report(tallies: dict[str, Tally], wall: dict[str, float]) -> int:
    print()
    print(f"{'target':<28} {'inputs':>8} {'accepted':>9} {'refused':>8} {'crashes':>8} {'5xx':>5} "
          f"{'hangs':>6} {'unexpl.':>8} {'max ms':>8}")  # fmt: skip
    total = Tally()
    for name, t in tallies.items():
        print(f"{name:<28} {t.inputs:>8} {t.accepted:>9} {t.rejected:>8} {t.crashes:>8} {t.server_errors:>5} "
              f"{t.hangs:>6} {t.unexplained:>8} {1000 * t.worst:>8.1f}")  # fmt: skip
        for attr in ("inputs", "accepted", "rejected", "crashes", "server_errors", "hangs", "unexplained"):
            setattr(total, attr, getattr(total, attr) + getattr(t, attr))
    print(f"{'total':<28} {total.inputs:>8} {total.accepted:>9} {total.rejected:>8} {total.crashes:>8} "
          f"{total.server_errors:>5} {total.hangs:>6} {total.unexplained:>8}")  # fmt: skip
    print("; ".join(f"{k} {v:.1f} s" for k, v in wall.items()))
    problems = [f"{name}: {ex}" for name, t in tallies.items() for ex in t.examples]
    for line in problems:
        print("  example:", line)
    return 1 if total.crashes or total.server_errors or total.hangs or total.unexplained else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--http", type=int, default=100_000, help="calls to the running extender")
    parser.add_argument("--decoders", type=int, default=100_000, help="inputs to the decoders, in process")
    parser.add_argument("--nodes", type=int, default=16, help="nodes of the fake cluster")
    parser.add_argument("--connections", type=int, default=4, help="concurrent mTLS connections")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds before a call counts as a hang")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    wall: dict[str, float] = {}
    start = time.perf_counter()
    tallies = fuzz_decoders(args.decoders, args.seed, not args.no_progress)
    wall["decoders"] = time.perf_counter() - start
    alive = True
    if args.http:
        start = time.perf_counter()
        http, alive = asyncio.run(
            fuzz_extender(
                args.http, args.seed, args.nodes, args.connections, args.timeout, not args.no_progress
            )
        )
        wall["extender"] = time.perf_counter() - start
        tallies = {**http, **tallies}
    status = report(tallies, wall)
    print(f"extender after the campaign: {'ready and answering' if alive else 'NOT answering'}")
    return status or (0 if alive else 1)


if __name__ == "__main__":
    sys.exit(main())
