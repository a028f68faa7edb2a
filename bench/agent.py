"""Node agent benchmark: discovery time per fixture, and the steady-state RSS and CPU of the running
agent (the real `topoalloc agent` process, publishing to a fake API server) at a 10 s resync.

    .venv/bin/python bench/agent.py [--seconds 60] [--resync 10] [--repeat 20]

Targets (issue 3): <= 100 ms discovery on the DGX H100 fixture, <= 80 MB RSS, <= 1% of a core.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.config import AgentConfig  # noqa: E402
from agent.discovery.discoverer import Discoverer  # noqa: E402
from agent.fixtures.loader import Fixture  # noqa: E402
from agent.publish.device_builder import NodeRef, build_device  # noqa: E402

FIXTURES = REPO / "hw-fixtures"


def discovery_times(name: str, repeat: int) -> tuple[float, float, float]:
    """(full pass ms, steady pass ms, Device build ms), medians over `repeat` runs."""
    full, steady, build = [], [], []
    cfg = AgentConfig()
    for _ in range(repeat):
        fx = Fixture.load(FIXTURES / name)
        d = Discoverer(fx.nvml, fx.sys_root, cfg)
        t0 = time.perf_counter()
        d.discover()  # first pass: every static NVML fact is read
        full.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        snap = d.discover()  # steady pass: load + sysfs, static NVML facts cached
        steady.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        build_device(snap, NodeRef(name, "uid"), cfg)
        build.append(time.perf_counter() - t0)
        d.stop()
    return tuple(statistics.median(x) * 1000 for x in (full, steady, build))  # type: ignore[return-value]


def running_agent(seconds: float, resync: float, warmup: float) -> dict[str, float]:
    """Start the real agent on the DGX H100 fixture against a fake API server; measure it."""
    from tests.support.fakeapi import FakeApiServer, ServerThread

    with ServerThread(FakeApiServer()) as server, tempfile.TemporaryDirectory() as tmp:
        node = "bench-node"
        server.put(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": node},
                "status": {
                    "capacity": {"cpu": "224", "memory": "2Ti"},
                    "allocatable": {"cpu": "224", "memory": "2Ti"},
                },
            }
        )
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "b",
                    "clusters": [{"name": "b", "cluster": {"server": server.url}}],
                    "users": [{"name": "b", "user": {}}],
                    "contexts": [{"name": "b", "context": {"cluster": "b", "user": "b"}}],
                }
            )
        )
        cgroups = Path(tmp) / "cgroup"
        cgroups.mkdir()
        config = Path(tmp) / "agent.yaml"
        config.write_text(yaml.safe_dump({"midTier": {"cgroupRoot": str(cgroups)}}))
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "topoalloc",
                "agent",
                "--fixture",
                str(FIXTURES / "dgx-h100"),
                "--node-name",
                node,
                "--kubeconfig",
                str(kubeconfig),
                "--config",
                str(config),
                "--resync",
                str(resync),
                "--health-port",
                "0",
                "--metrics-address",
                "127.0.0.1",
                "--metrics-port",
                "0",
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            p = psutil.Process(proc.pid)
            deadline = time.monotonic() + 30
            while server.get("devices", node) is None:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the agent did not publish")
                time.sleep(0.05)
            time.sleep(warmup)
            server.clear_requests()
            cpu0, wall0 = sum(p.cpu_times()[:2]), time.monotonic()
            peak = 0.0
            while time.monotonic() - wall0 < seconds:
                peak = max(peak, p.memory_info().rss)
                time.sleep(0.5)
            cpu1, wall1 = sum(p.cpu_times()[:2]), time.monotonic()
            rss = p.memory_info().rss
            writes = [r for r in server.requests() if r.method in ("POST", "PUT", "PATCH")]
            return {
                "rss_mb": rss / 2**20,
                "peak_rss_mb": max(peak, rss) / 2**20,
                "cpu_percent": 100.0 * (cpu1 - cpu0) / (wall1 - wall0),
                "seconds": wall1 - wall0,
                "writes": float(len(writes)),
                "requests": float(len(server.requests())),
            }
        finally:
            proc.terminate()
            proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="measurement window of the running agent")
    parser.add_argument("--resync", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=20, help="discovery runs per fixture")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the CPU-only fixture says "NVML unavailable" on every run

    names = sorted(p.name for p in FIXTURES.iterdir() if (p / "nvml.json").is_file())
    print(f"{'fixture':28} {'full pass ms':>13} {'steady pass ms':>15} {'Device build ms':>16}")
    for name in names:
        full, steady, build = discovery_times(name, args.repeat)
        mark = "  (target <= 100 ms)" if name == "dgx-h100" else ""
        print(f"{name:28} {full:13.1f} {steady:15.1f} {build:16.1f}{mark}")

    print(f"\nrunning agent, dgx-h100 fixture, resync {args.resync:g} s, measured over {args.seconds:g} s:")
    # warm-up: the first passes publish (Device, Node, then mid-tier once the pod list is in)
    m = running_agent(args.seconds, args.resync, warmup=2 * args.resync + 5.0)
    print(f"{'metric':28} {'value':>10} {'target':>10}")
    print(f"{'RSS (MB)':28} {m['rss_mb']:10.1f} {'<= 80':>10}")
    print(f"{'peak RSS (MB)':28} {m['peak_rss_mb']:10.1f} {'':>10}")
    print(f"{'CPU (% of one core)':28} {m['cpu_percent']:10.2f} {'<= 1':>10}")
    print(f"{'API writes in window':28} {m['writes']:10.0f} {'0':>10}")
    print(f"{'API requests in window':28} {m['requests']:10.0f} {'':>10}")


if __name__ == "__main__":
    main()
