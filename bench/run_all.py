"""Run every benchmark in turn (`make bench`); each prints its own table.

scheduler_throughput.py, placement_throughput.py, placement_topology.py, gang_burst.py, dra.py and
scarce_avoidance.py need the Kubernetes binaries
of ../shared/k8s and etcd;
without them each says so and is skipped. `--quick` shortens the long ones (fewer repeats, a
shorter agent window, 3 trace seeds, smaller clusters).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent

FULL: list[tuple[str, list[str]]] = [
    ("core.py", []),
    ("gpu_sets.py", []),
    ("gang.py", []),
    ("agent.py", []),
    ("deviceplugin.py", []),
    ("extender.py", []),
    ("scheduler_throughput.py", ["--burst", "1000", "--failover"]),
    ("placement_throughput.py", []),
    ("placement_topology.py", []),
    ("gang_burst.py", ["--runs", "5"]),
    ("dra.py", ["--runs", "2"]),
    ("scarce_avoidance.py", []),
    ("trace.py", ["default"]),
    ("quality.py", []),
    # The full campaign (100,000 calls to the extender and 100,000 decoder inputs) is `make fuzz`.
    # The soak (real control planes, faults injected, minutes to hours) is `make soak`.
    ("fuzz.py", ["--http", "10000", "--decoders", "30000"]),
]
QUICK_ARGS = {
    "core.py": ["--repeat", "3"],
    "gpu_sets.py": ["--repeat", "3"],
    "gang.py": ["--nodes", "1000", "--repeat", "2"],
    "agent.py": ["--seconds", "20", "--repeat", "5"],
    "deviceplugin.py": [],
    "extender.py": ["--nodes", "1000", "5000"],
    "scheduler_throughput.py": ["--nodes", "200", "--pods", "200"],
    "placement_throughput.py": ["--nodes", "200", "--pods", "200", "--runs", "2"],
    "placement_topology.py": [
        "--nodes",
        "dgx-h100=3,dgx1-v100=3,a100-pcie-4x-nvlink-pairs=2",
        "--pods",
        "40",
    ],
    "gang_burst.py": ["--runs", "3"],
    "dra.py": ["--nodes", "100", "--pods", "300"],
    "scarce_avoidance.py": ["--nodes", "60", "--pods", "200", "--creates", "100", "--runs", "2"],
    "trace.py": ["default", "--seeds", "42-44"],
    "quality.py": ["--seeds", "1-3"],
    "fuzz.py": ["--http", "2000", "--decoders", "10000"],
}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", help="run only these scripts, e.g. core.py trace.py")
    args = parser.parse_args()
    failed = []
    for script, full_args in FULL:
        if args.only and script not in args.only:
            continue
        path = BENCH / script
        if not path.exists():
            print(f"== {script}: not present, skipped", flush=True)
            continue
        argv = QUICK_ARGS[script] if args.quick else full_args
        print(f"\n== {script} {' '.join(argv)}", flush=True)
        start = time.monotonic()
        rc = subprocess.call([sys.executable, str(path), *argv])
        print(f"== {script}: exit {rc} in {time.monotonic() - start:.1f} s", flush=True)
        if rc:
            failed.append(script)
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
