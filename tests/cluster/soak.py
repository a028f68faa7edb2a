"""The soak on a running tier cluster: world (soak_world.py), workload (soak_workload.py) and faults
(soak_faults.py) for `duration` seconds, the invariants (tests/soak/invariants.py) checked every
`check_every` seconds the whole time. The first violation stops it and writes a reproduction record
(seed, release, fault schedule and what was injected, the workload's actions, the violations, the
pods, claims and Reservations as the API server had them) as JSON. No pytest here: bench/soak.py
and tests/cluster/test_soak.py both call `run_soak`.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.harness import ClusterEnv
from tests.cluster.soak_faults import Injector, schedule
from tests.cluster.soak_workload import Workload, gang_sources_of
from tests.cluster.soak_world import SoakWorld
from tests.soak.invariants import Checker, Limits, Snapshot, Violation

# Log lines that look alarming but are what a component is expected to log under these faults.
EXPECTED_LOG = ()


@dataclass
class SoakConfig:
    duration: float = 120.0
    seed: int = 1
    plugin_nodes: int = 3
    dra_nodes: int = 1
    fault_every: float = 25.0
    check_every: float = 5.0
    grace: float = 30.0
    max_grace: float = 90.0
    record_dir: Path = Path(".")


@dataclass
class SoakResult:
    release: str
    config: SoakConfig
    elapsed: float = 0.0
    violations: list[Violation] = field(default_factory=list)
    record: Path | None = None
    counts: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    fault_errors: list[str] = field(default_factory=list)
    checks: int = 0
    max_rss_mib: dict[str, float] = field(default_factory=dict)
    p99_s: list[float] = field(default_factory=list)

    def rows(self) -> list[tuple[str, str]]:
        """The result table: (what, value)."""
        out = [("release", self.release), ("seed", str(self.config.seed)), ("ran (s)", f"{self.elapsed:.0f}")]
        out += [(k, str(v)) for k, v in sorted(self.counts.items())]
        out += [(f"fault {k}", str(v)) for k, v in sorted(self.faults.items())]
        out += [("faults failed to inject", str(len(self.fault_errors)))]
        out += [(f"max RSS {k} (MiB)", f"{v:.0f}") for k, v in sorted(self.max_rss_mib.items())]
        if self.p99_s:
            out += [
                (
                    "decision p99 (s) first/max/last",
                    f"{self.p99_s[0]:.3f}/{max(self.p99_s):.3f}/{self.p99_s[-1]:.3f}",
                )
            ]
        out += [("invariant checks", str(self.checks)), ("violations", str(len(self.violations)))]
        return out

    def table(self) -> str:
        width = max(len(k) for k, _ in self.rows())
        return "\n".join(f"{k:<{width}}  {v}" for k, v in self.rows())


def run_soak(
    cluster: ClusterEnv, config: SoakConfig, progress: Callable[[float], None] | None = None
) -> SoakResult:
    rng = random.Random(config.seed)
    world = SoakWorld(cluster, plugin_count=config.plugin_nodes, dra_count=config.dra_nodes)
    result = SoakResult(cluster.release.version, config)
    world.start()
    stop = threading.Event()
    workload = Workload(
        cluster,
        random.Random(rng.random()),
        world.clock,
        gpu_capacity=8 * config.plugin_nodes,
        sources=gang_sources_of(cluster.release.minor),
    )
    injector = Injector(
        world, random.Random(rng.random()), schedule(rng, config.duration, config.fault_every)
    )
    checker = Checker(Limits(grace=config.grace, max_grace=config.max_grace, expected_log=EXPECTED_LOG))
    threads = [
        threading.Thread(target=workload.run, args=(stop,), name="soak-workload", daemon=True),
        threading.Thread(target=injector.run, args=(stop,), name="soak-faults", daemon=True),
    ]
    for t in threads:
        t.start()
    raw: dict[str, Any] = {}
    last: Snapshot | None = None
    try:
        while world.clock() < config.duration:
            time.sleep(config.check_every)
            world.sample_rss()
            world.sample_latency()
            try:
                snap, raw = world.snapshot(
                    injector.last, dict(workload.gangs), dict(workload.created), dict(workload.expiries)
                )
            except Exception:  # kube-apiserver restarting: the next check reads again
                continue
            result.checks += 1
            last = snap
            if progress is not None:
                progress(world.clock())
            result.violations = checker.check(snap)
            if result.violations:
                break
    finally:
        stop.set()
        for t in threads:
            t.join(120)
        result.elapsed = world.clock()
        result.counts = dict(workload.counts)
        assert world.kubelets is not None
        result.counts["admitted or prepared by kubelets"] = world.kubelets.admitted
        result.counts["terminating pods finished by kubelets"] = world.kubelets.terminated
        result.counts["kubelet passes failed (API down)"] = world.kubelets.failed_passes
        if last is not None:  # where the pods stood at the last check
            live = [p for p in last.pods.values() if not p.finished]
            result.counts["at the end: pods bound"] = sum(1 for p in live if p.node)
            result.counts["at the end: pods pending"] = sum(1 for p in live if not p.node)
            gone = set(workload.created) - workload.removed - set(last.pods)
            result.counts["pods gone by eviction or preemption"] = len(gone)
            result.counts["at the end: claims allocated"] = sum(
                1 for c in last.claims.values() if c.allocated
            )
        result.faults = dict(injector.counts)
        result.fault_errors = [f"{f.kind} at {f.at:.0f}s: {f.error}" for f in injector.faults if f.error]
        result.max_rss_mib = {
            kind: world.max_rss(prefix) / 2**20
            for kind, prefix in (("allocator", "allocator-"), ("agent", "agent-"))
        }
        result.p99_s = [p for _, p in world.p99]
        if result.violations:
            result.record = write_record(config, result, injector.records(), workload.log, raw)
        world.stop()
    return result


def write_record(
    config: SoakConfig,
    result: SoakResult,
    faults: list[dict[str, Any]],
    actions: list[str],
    raw: dict[str, Any],
) -> Path:
    path = config.record_dir / f"soak-{result.release}-seed{config.seed}-{int(time.time())}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "release": result.release,
        "seed": config.seed,
        "duration": config.duration,
        "config": {k: str(v) for k, v in vars(config).items()},
        "at": result.elapsed,
        "violations": [asdict(v) for v in result.violations],
        "faults": faults,
        "actions": actions[-400:],
        "objects": raw,
    }
    path.write_text(json.dumps(record, indent=1, default=str))
    return path
