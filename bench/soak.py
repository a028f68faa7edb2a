"""The soak: topoalloc on a real control plane under a mixed workload with faults at random times,
every invariant checked the whole time (`make soak`, docs/reliability.md).

Per release asked for, the real-cluster tier's world (tests/cluster/harness.py: etcd, kube-apiserver,
kube-scheduler with the project's extender configuration, kube-controller-manager, the webhooks),
then the soak's (tests/cluster/soak_world.py): device plugin nodes (real agents serving stand-in
kubelets) and DRA nodes (real agents' DRA plugins, stand-in DRA kubelets), two allocator replicas
with defragmentation on. A seeded workload (tests/cluster/soak_workload.py) and a seeded fault
schedule (tests/cluster/soak_faults.py: agent, leader and follower SIGKILLed, kube-apiserver
restarted, etcd compacted, the webhook unreachable, a GPU unhealthy and back) run for the duration;
the invariants (tests/soak/invariants.py) are checked every few seconds. A violation stops the run
and writes a reproduction record (JSON); the exit status is then 1. A table per release at the end:
pods, gangs, claims and Reservations created, faults by kind, max RSS, decision p99. The
allocator's and the agents' API requests are recorded from kube-apiserver's audit log and held
against the manifests' RBAC: a request refused for want of a rule, or allowed by no rule of theirs,
fails the run too (unused grants are judged over the whole real-cluster tier, not one soak).

Run: `make soak` (2 minutes, v1.36), `make soak DURATION=30m SEED=7 RELEASE=1.35,1.36`, or
`.venv/bin/python bench/soak.py --duration 10m --seed 3 --release 1.35`
(needs ../shared/k8s*, /usr/bin/etcd and kubectl; exits 0 with a note when they are missing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster.harness import ClusterEnv  # noqa: E402
from tests.cluster.least_privilege import refusals  # noqa: E402
from tests.cluster.soak import SoakConfig, SoakResult, run_soak  # noqa: E402
from tests.support import api_audit  # noqa: E402
from tests.support.kube_releases import RELEASES  # noqa: E402


def seconds(text: str) -> float:
    """`90`, `90s`, `10m`, `1h`."""
    text = text.strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:], 0)
    return float(text[:-1]) * scale if scale else float(text)


def one_release(minor: str, config: SoakConfig, keep: bool) -> tuple[SoakResult, list[str]] | None:
    """The soak's result, and what its API requests say against the manifests' RBAC."""
    release = RELEASES[minor]
    missing = release.missing_parts()
    if missing:
        print(f"soak on {release.version} skipped: needs " + "; ".join(missing))
        return None
    workdir = Path(tempfile.mkdtemp(prefix=f"soak-{minor}-"))
    # kube-apiserver's audit log of topoalloc's accounts, boiled down here when the control plane
    # stops (tests/support/api_audit.py): the allocator and agents run under the manifests' RBAC
    audit = workdir / "api-audit"
    audit.mkdir()
    os.environ[api_audit.AUDIT_DIR_ENV] = str(audit)
    cluster = ClusterEnv(workdir, release=release)
    result: SoakResult | None = None
    try:
        cluster.start()
        with tqdm(total=round(config.duration), desc=f"soak {release.version}", unit="s") as bar:

            def progress(now: float) -> None:
                bar.update(max(0, min(round(now), bar.total) - bar.n))

            result = run_soak(cluster, config, progress)
    finally:
        cluster.stop()
        rbac = refusals(api_audit.load(audit)) if result is not None else []
        if keep:
            print(f"logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return result, rbac


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", default="2m", help="how long the workload runs (90, 90s, 10m, 1h)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--release", default="1.36", help="comma-separated minors (1.35,1.36)")
    parser.add_argument("--plugin-nodes", type=int, default=3)
    parser.add_argument("--dra-nodes", type=int, default=1)
    parser.add_argument("--fault-every", type=float, default=25.0, help="seconds between faults, about")
    parser.add_argument(
        "--records", type=Path, default=Path("soak-records"), help="where violations are written"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directories (logs)")
    args = parser.parse_args(argv)
    # a stopped run (kill, timeout) still stops its control plane, nodes and allocators: SystemExit
    # unwinds through one_release's `finally`, where the default SIGTERM would leave them running
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    minors = [m.strip().lstrip("v") for m in args.release.split(",") if m.strip()]
    unknown = [m for m in minors if m not in RELEASES]
    if unknown:
        parser.error(f"unknown release(s) {unknown}; known: {sorted(RELEASES)}")
    config = SoakConfig(
        duration=seconds(args.duration),
        seed=args.seed,
        plugin_nodes=args.plugin_nodes,
        dra_nodes=args.dra_nodes,
        fault_every=args.fault_every,
        record_dir=args.records,
    )
    failed = False
    for minor in minors:
        outcome = one_release(minor, config, args.keep)
        if outcome is None:
            continue
        result, rbac = outcome
        print(result.table())
        for line in rbac:
            print(f"LEAST PRIVILEGE {line}")
        if not rbac:
            print("least privilege: no request of the allocator or agents refused, none outside their rules")
        for violation in result.violations:
            print(f"VIOLATION {violation}")
        for error in result.fault_errors:
            print(f"fault not injected: {error.splitlines()[0]}")
        if result.record is not None:
            print(f"reproduction record: {result.record}")
        failed |= bool(result.violations) or bool(rbac)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
