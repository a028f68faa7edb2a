"""Device plugin benchmark: kubelet-side latency of GetPreferredAllocation and Allocate, measured by
the stand-in kubelet (tests/support/kubelet.py) against the real agent on the DGX H100 fixture (8 GPUs)
with its pods in the fake API server.

    .venv/bin/python bench/deviceplugin.py [--pods 100]

Scenarios:
- whole: `--pods` pods of `nvidia.com/gpu: 1`, all bound to the node up front (each annotated with
  GPU i mod 8); kubelet admits them in turn and each finishes before the next one on its GPU, so the
  node's pod list grows to `--pods` entries (finished pods included), as on a busy node.
- shared: 96 pods of `koordinator.sh/gpu-core: 8` held at once (12 per GPU): every call works on the
  800 gpu-core IDs.

Each call includes the agent's pod LIST (cached for 0.5 s), the annotation parse, the Allocate answer
and the checkpoint write (fsync) after each served container.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.extender import pct  # noqa: E402
from tests.agent.deviceplugin.rig import Rig, allocated, gpu_entry  # noqa: E402
from tests.support.fakeapi import FakeApiServer, ServerThread  # noqa: E402


def _ms(values: list[float], q: float) -> float:
    return 1000 * pct(values, q)


def _finish(rig: Rig, name: str) -> None:
    pod = rig.server.get("pods", name, "default")
    pod["status"]["phase"] = "Succeeded"
    rig.server.put(pod)
    assert rig.kubelet is not None
    rig.kubelet.release("default", name)


def whole(rig: Rig, pods: int) -> dict[str, list[float]]:
    assert rig.kubelet is not None
    docs = []
    for i in range(pods):
        minor = i % 8
        docs.append(
            rig.put_pod(f"w{i:04d}", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(minor)]))
        )
    for i, doc in enumerate(docs):
        got = rig.kubelet.admit(doc)["main"]["nvidia.com/gpu"]
        assert got.ids == [rig.uuid(i % 8)], (i, got.ids)
        _finish(rig, doc["metadata"]["name"])
    return rig.kubelet.latencies


def shared(rig: Rig) -> dict[str, list[float]]:
    assert rig.kubelet is not None
    limits = {"koordinator.sh/gpu-core": "8", "koordinator.sh/gpu-memory-ratio": "8"}
    docs = [
        rig.put_pod(f"s{i:04d}", {"main": limits}, allocated([gpu_entry(i % 8, core=8)])) for i in range(96)
    ]
    for doc in docs:
        got = rig.kubelet.admit(doc)["main"]["koordinator.sh/gpu-core"]
        assert len(got.ids) == 8
    return rig.kubelet.latencies


def run(scenario: str, pods: int) -> dict[str, list[float]]:
    with ServerThread(FakeApiServer()) as server, server.sync_api_client() as client:
        rig = Rig(server, client, "dgx-h100")
        try:
            rig.start_kubelet()
            rig.start_agent(wait_for=("nvidia.com/gpu", "koordinator.sh/gpu-core"))
            return whole(rig, pods) if scenario == "whole" else shared(rig)
        finally:
            rig.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=100)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    rows = []
    for scenario in ("whole", "shared"):
        started = time.perf_counter()
        lat = run(scenario, args.pods)
        wall = time.perf_counter() - started
        pref, alloc = lat["GetPreferredAllocation"], lat["Allocate"]
        both = [p + a for p, a in zip(pref, alloc, strict=True)]
        rows.append((scenario, len(alloc), pref, alloc, both, wall))
    print(
        f"{'scenario':<8} {'pods':>5} {'pref p50':>9} {'pref p99':>9} {'alloc p50':>10} {'alloc p99':>10} "
        f"{'both p99':>9} {'alloc max':>10} {'wall s':>7}"
    )
    for scenario, n, pref, alloc, both, wall in rows:
        print(
            f"{scenario:<8} {n:>5} {_ms(pref, 0.5):>8.2f}m {_ms(pref, 0.99):>8.2f}m {_ms(alloc, 0.5):>9.2f}m "
            f"{_ms(alloc, 0.99):>9.2f}m {_ms(both, 0.99):>8.2f}m {1000 * max(alloc):>9.2f}m {wall:>7.1f}"
        )
    print(f"(milliseconds; mean Allocate {1000 * statistics.mean(rows[0][3]):.2f} ms for `whole`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
