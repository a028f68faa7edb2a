"""The allocator's CPU per placement decided at admission, without a control plane.

The real allocator (placement mode, leading) runs in this process against the fake API server with
N dgx-h100 nodes (8 GPUs + 8 NICs each, their Device CRs); P pods owned by a Job are then sent one
after another to the placement route exactly as the admission server calls it. Each decision's
process CPU time is measured (time.process_time around the route), and then the cost of the watch
taking the P pods in (the pods created on the fake server carrying what the route decided, until
every one is in the allocator's cache). This isolates the allocator's own work from kube-apiserver's
and kube-scheduler's, which bench/placement_throughput.py measures together on a real control plane.

Run: `.venv/bin/python bench/admission_cpu.py [--nodes 500] [--pods 500] [--gpus 1] [--cprofile FILE]
[--cprofile-watch FILE] [--https]`
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import cProfile
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import jsonpatch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from allocator.placement.webhook import PATH  # noqa: E402
from tests.gang.harness import gpu_node  # noqa: E402
from tests.placement.harness import gpu_pod, placement_settings  # noqa: E402
from tests.support.allocator_harness import running_allocator  # noqa: E402
from tests.support.fakeapi import FakeApiServer  # noqa: E402
from tests.support.fakeapi.pods import PodBehaviour  # noqa: E402
from tests.support.pki import Pki  # noqa: E402

JSON = dict[str, Any]
# Decisions left out of the figures: the first fills the core's columns for every node (once per
# node and Device CR, not per pod); it is reported on its own.
WARMUP = 20
JOB = {"apiVersion": "batch/v1", "kind": "Job", "name": "job", "uid": "job-uid", "controller": True}


def owned(i: int, gpus: int) -> JSON:
    pod = gpu_pod("", gpus)
    # Named already (the API server names it after admission), so the cache can be asked for it.
    pod["metadata"] = {"namespace": "default", "ownerReferences": [JOB], "name": f"job-{i:05d}"}
    return pod


def review(i: int, gpus: int) -> JSON:
    """The admission request the API server sends for a Job's i-th pod: defaulted first (as the
    API server decodes it, and its own admission plugins run before the webhooks)."""
    pod = owned(i, gpus)
    PodBehaviour().prepare_create(pod, "")
    return {"uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "default", "operation": "CREATE", "object": pod}  # fmt: skip


def patched(request: JSON, answer: JSON) -> JSON | None:
    if "patch" not in answer:
        return None
    return jsonpatch.apply_patch(request["object"], json.loads(base64.b64decode(answer["patch"])))


async def taken_in(fake: FakeApiServer, cache: Any, placed: list[JSON]) -> float:
    """CPU seconds from creating the placed pods on the fake server to all of them in the cache,
    less the fake server's own storing of them (its copies and defaults, which run in this process
    and cost several times what the allocator's watch does)."""
    start = time.process_time()
    for pod in placed:
        fake.put(pod)
    stored = time.process_time() - start
    keys = [f"default/{p['metadata']['name']}" for p in placed]
    deadline = time.monotonic() + 120
    while not all(k in cache.pods for k in keys):
        if time.monotonic() > deadline:
            raise SystemExit("the allocator's cache did not take the pods in within 120 s")
        await asyncio.sleep(0.01)
    return time.process_time() - start - stored


# The API server's side of `--https`, in a process of its own: one kept-alive TLS connection, each
# review POSTed in turn, as kube-apiserver calls a webhook.
CLIENT = """
import http.client, ssl, sys
host, port, path, ca, bodies = sys.argv[1:]
ctx = ssl.create_default_context(cafile=ca)
ctx.check_hostname = False
conn = http.client.HTTPSConnection(host, int(port), context=ctx)
patched = 0
for line in open(bodies, "rb"):
    conn.request("POST", path, body=line, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    body = resp.read()
    assert resp.status == 200, (resp.status, body)
    patched += b'"patch"' in body
print(patched)
"""


async def over_https(run: Any, pki: Pki, tmp: str, first: int, pods: int, gpus: int) -> tuple[float, int]:
    """CPU seconds of this process (the allocator, its admission server included) while a client
    process sends `pods` reviews over HTTPS, and how many were answered with a patch."""
    bodies = Path(tmp) / "reviews.jsonl"
    with bodies.open("wb") as out:
        for i in range(first, first + pods):
            envelope = {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": review(i, gpus),
            }
            out.write(json.dumps(envelope).encode() + b"\n")
    port = run.service.webhook_port
    start = time.process_time()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, "127.0.0.1", str(port), PATH, str(pki.ca_file), str(bodies),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out_bytes, _ = await proc.communicate()
    spent = time.process_time() - start
    if proc.returncode != 0:
        raise SystemExit("the HTTPS client failed")
    return spent, int(out_bytes)


Profile = cProfile.Profile | None


async def measure(
    nodes: int, pods: int, gpus: int, profile: Profile, watch_profile: Profile, https: bool = False
) -> JSON:
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeApiServer() as fake:
            for i in range(nodes):
                gpu_node(fake, f"node-{i:04d}")
            pki = Pki(Path(tmp) / "pki")
            async with running_allocator(fake, pki, placement=placement_settings()) as run:
                placement = run.service.component("placement")
                await placement.runner.wait_passes(1)  # leading and synced: the route may decide
                route = placement.routes()[PATH]
                costs: list[float] = []
                placed: list[JSON] = []
                for i in range(pods + WARMUP):
                    request = review(i, gpus)
                    if profile and i >= WARMUP:
                        profile.enable()
                    start = time.process_time()
                    answer = route(request)
                    costs.append(time.process_time() - start)
                    if profile:
                        profile.disable()
                    if (pod := patched(request, answer)) is not None:
                        placed.append(pod)
                if watch_profile:
                    watch_profile.enable()
                watch = await taken_in(fake, run.service.cache, placed)
                if watch_profile:
                    watch_profile.disable()
                if https:
                    spent, answered = await over_https(run, pki, tmp, pods + WARMUP, pods, gpus)
    ms = sorted(c * 1000 for c in costs[WARMUP:])
    return {
        "first": costs[0] * 1000,
        "nodes": nodes,
        "pods": pods,
        "placed": len(placed) - WARMUP,
        "p50": statistics.median(ms),
        "p99": ms[int(len(ms) * 0.99) - 1] if len(ms) >= 100 else ms[-1],
        "mean": statistics.fmean(ms),
        "watch": watch * 1000 / max(1, len(placed)),
        "https": spent * 1000 / pods if https else None,
        "https_placed": answered if https else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per pod")
    parser.add_argument("--cprofile", type=Path, help="write a cProfile of the decisions here")
    parser.add_argument(
        "--cprofile-watch",
        type=Path,
        help="write a cProfile of the watch taking the pods in here (the fake"
        " API server's side included: it runs in this process)",
    )
    parser.add_argument(
        "--https",
        action="store_true",
        help="then send as many reviews again over HTTPS from a client process"
        " and print this process's CPU per review (the admission server's TLS, HTTP and JSON included)",
    )
    args = parser.parse_args()
    # CPU time, not wall time: the figures stay meaningful on a busy machine.
    profile = cProfile.Profile(time.process_time) if args.cprofile else None
    watch_profile = cProfile.Profile(time.process_time) if args.cprofile_watch else None
    row = asyncio.run(measure(args.nodes, args.pods, args.gpus, profile, watch_profile, args.https))
    if profile and args.cprofile:
        profile.dump_stats(args.cprofile)
    if watch_profile and args.cprofile_watch:
        watch_profile.dump_stats(args.cprofile_watch)
    print(
        f"{'nodes':>6} {'pods':>6} {'placed':>7} {'first ms':>9} {'decide p50 ms':>14} {'p99 ms':>8}"
        f" {'mean ms':>8} {'watch ms/pod':>13}"
    )
    print(
        f"{row['nodes']:>6} {row['pods']:>6} {row['placed']:>7} {row['first']:>9.1f} {row['p50']:>14.3f}"
        f" {row['p99']:>8.3f} {row['mean']:>8.3f} {row['watch']:>13.3f}"
    )

    if row["https"] is not None:
        print(
            f"over HTTPS: {row['https']:.3f} ms CPU per review"
            f" ({row['https_placed']} of {row['pods']} placed)"
        )


if __name__ == "__main__":
    main()
