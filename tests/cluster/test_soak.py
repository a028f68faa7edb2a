"""The short soak (tests/cluster/soak.py, `make soak` for the long one): on each release's tier
cluster, about two and a half minutes of the seeded mixed workload with every kind of fault injected
at seeded times (an agent, the leader and the follower SIGKILLed, kube-apiserver restarted, etcd
compacted, the webhook unreachable, a GPU unhealthy and back), the invariants checked every few
seconds: none may be violated, and every fault must have been injected."""

from __future__ import annotations

from pathlib import Path

from tests.cluster.harness import ClusterEnv
from tests.cluster.soak import SoakConfig, run_soak
from tests.cluster.soak_faults import KINDS

SEED = 42
DURATION = 150.0


def test_a_short_soak_with_every_fault_holds_every_invariant(cluster: ClusterEnv, tmp_path: Path) -> None:
    config = SoakConfig(
        duration=DURATION, seed=SEED, plugin_nodes=3, dra_nodes=1, fault_every=12.0, record_dir=tmp_path
    )
    result = run_soak(cluster, config)
    print(result.table())
    assert not result.violations, f"{[str(v) for v in result.violations]}; record: {result.record}"
    assert not result.fault_errors, result.fault_errors
    assert set(result.faults) == set(KINDS), result.faults
    # the workload really ran: pods were admitted by the kubelets and checks ran the whole time
    assert result.counts["admitted or prepared by kubelets"] >= 10, result.counts
    assert result.checks >= DURATION / config.check_every / 2
