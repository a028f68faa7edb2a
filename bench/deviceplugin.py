"""Device plugin benchmark: kubelet-side latency of GetPreferredAllocation and Allocate, measured by
the stand-in kubelet (tests/support/kubelet.py) against the real agent on the DGX H100 fixture (8 GPUs)
with its pods in the fake API server.

    .venv/bin/python bench/deviceplugin.py [--pods 100] [--agent thread|process|both]

Where the agent runs:
- thread: on a thread of the benchmark's own process, beside the stand-in kubelet and the fake API
  server (all three share one interpreter lock: the client's and the server's Python add up);
- process: as its own process (`topoalloc agent --fixture ... --device-plugin`, through the fork
  server), as on a node where kubelet is another process.

Scenarios:
- whole: `--pods` pods of `nvidia.com/gpu: 1`, all bound to the node up front (each annotated with
  GPU i mod 8); kubelet admits them in turn and each finishes before the next one on its GPU, so the
  node's pod list grows to `--pods` entries (finished pods included), as on a busy node.
- shared: 96 pods of `koordinator.sh/gpu-core: 8` held at once (12 per GPU): every call works on the
  800 gpu-core IDs.
- chosen: as whole, without annotations: the node chooses each pod's GPU by topology (its use by
  the journal, the interconnect matrix), the write of its annotation runs beside the calls.

Each call includes kubelet's PodResources `List` (GetPreferredAllocation), the agent's view of the
node's pods (its pod watch; a LIST only for a pod the watch has not shown yet), the annotation parse,
the Allocate answer and the served container's journal record, on disk before Allocate answers.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Protocol

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.extender import pct  # noqa: E402
from tests.agent.deviceplugin.rig import Rig, allocated, gpu_entry, pod_doc  # noqa: E402
from tests.support.agent_node import AgentNode  # noqa: E402
from tests.support.fakeapi import FakeApiServer, ServerThread  # noqa: E402


def _ms(values: list[float], q: float) -> float:
    return 1000 * pct(values, q)


class Node(Protocol):
    """What the scenarios need of either setup (the in-thread Rig or an AgentNode process)."""

    server: FakeApiServer
    kubelet: Any

    def uuid(self, minor: int) -> str: ...


def _put(node: Node, name: str, limits: dict[str, str], annotation: str | None) -> dict[str, Any]:
    return node.server.put(pod_doc(name, {"main": limits}, annotation))


def _finish(node: Node, name: str) -> None:
    pod = node.server.get("pods", name, "default")
    pod["status"]["phase"] = "Succeeded"
    node.server.put(pod)
    node.kubelet.release("default", name)


def whole(node: Node, pods: int) -> dict[str, list[float]]:
    docs = [
        _put(node, f"w{i:04d}", {"nvidia.com/gpu": "1"}, allocated([gpu_entry(i % 8)])) for i in range(pods)
    ]
    for i, doc in enumerate(docs):
        got = node.kubelet.admit(doc)["main"]["nvidia.com/gpu"]
        assert got.ids == [node.uuid(i % 8)], (i, got.ids)
        _finish(node, doc["metadata"]["name"])
    return dict(node.kubelet.latencies)


def chosen(node: Node, pods: int) -> dict[str, list[float]]:
    docs = [_put(node, f"c{i:04d}", {"nvidia.com/gpu": "1"}, None) for i in range(pods)]
    for doc in docs:
        got = node.kubelet.admit(doc)["main"]["nvidia.com/gpu"]
        assert len(got.ids) == 1
        _finish(node, doc["metadata"]["name"])
    return dict(node.kubelet.latencies)


def _scenario(node: Node, scenario: str, pods: int) -> dict[str, list[float]]:
    if scenario == "shared":
        return shared(node)
    return chosen(node, pods) if scenario == "chosen" else whole(node, pods)


def shared(node: Node) -> dict[str, list[float]]:
    limits = {"koordinator.sh/gpu-core": "8", "koordinator.sh/gpu-memory-ratio": "8"}
    docs = [_put(node, f"s{i:04d}", limits, allocated([gpu_entry(i % 8, core=8)])) for i in range(96)]
    for doc in docs:
        got = node.kubelet.admit(doc)["main"]["koordinator.sh/gpu-core"]
        assert len(got.ids) == 8
    return dict(node.kubelet.latencies)


def run(scenario: str, pods: int, agent: str = "thread") -> dict[str, list[float]]:
    with ServerThread(FakeApiServer()) as server, server.sync_api_client() as client:
        if agent == "process":
            node = AgentNode(server, verbose=False)  # as the DaemonSet runs it
            try:
                node.start_agent()
                uuids = {m: node.uuid(m) for m in range(8)}  # read once: not part of the calls
                node.uuid = uuids.__getitem__  # type: ignore[method-assign]
                return _scenario(node, scenario, pods)
            finally:
                node.close()
        rig = Rig(server, client, "dgx-h100")
        try:
            rig.start_kubelet()
            rig.start_agent(wait_for=("nvidia.com/gpu", "koordinator.sh/gpu-core"))
            return _scenario(rig, scenario, pods)  # type: ignore[arg-type]
        finally:
            rig.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--agent", choices=("thread", "process", "both"), default="both")
    parser.add_argument(
        "--runs", type=int, default=1, help="repeat each case; the table shows the median over runs"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    rows = []
    for agent in ("thread", "process") if args.agent == "both" else (args.agent,):
        for scenario in ("whole", "shared", "chosen"):
            runs = []
            for _ in range(args.runs):
                started = time.perf_counter()
                lat = run(scenario, args.pods, agent)
                wall = time.perf_counter() - started
                pref, alloc = lat["GetPreferredAllocation"], lat["Allocate"]
                both = [p + a for p, a in zip(pref, alloc, strict=True)]
                runs.append(
                    (
                        _ms(pref, 0.5),
                        _ms(pref, 0.99),
                        _ms(alloc, 0.5),
                        _ms(alloc, 0.99),
                        _ms(both, 0.99),
                        1000 * max(alloc),
                        wall,
                    )
                )
            rows.append(
                (agent, scenario, len(alloc), [statistics.median(col) for col in zip(*runs, strict=True)])
            )
    print(
        f"{'agent':<8} {'scenario':<8} {'pods':>5} {'pref p50':>9} {'pref p99':>9} {'alloc p50':>10} "
        f"{'alloc p99':>10} {'both p99':>9} {'alloc max':>10} {'wall s':>7}"
    )
    for agent, scenario, n, (pref50, pref99, alloc50, alloc99, both99, alloc_max, wall) in rows:
        print(
            f"{agent:<8} {scenario:<8} {n:>5} {pref50:>8.2f}m {pref99:>8.2f}m {alloc50:>9.2f}m "
            f"{alloc99:>9.2f}m {both99:>8.2f}m {alloc_max:>9.2f}m {wall:>7.1f}"
        )
    runs_note = f", median of {args.runs} runs" if args.runs > 1 else ""
    print(f"(milliseconds, as the stand-in kubelet measures each call{runs_note})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
