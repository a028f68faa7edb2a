"""Mid-tier resources: the issue's formula on table cases, per-pod cgroup v2 usage from a fixture
tree over a sliding window, and "publish nothing" when an input is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import MidTierConfig
from agent.midtier.pod_watch import PodInfo, pod_requests
from agent.midtier.reclaimable import MidInputs, MidTier, mid_allocatable, pod_cgroup_dirs

GI = 1 << 30


@pytest.mark.parametrize(
    ("inputs", "threshold", "unallocated", "margin", "expected"),
    [
        # no prod pods: nothing to reclaim, nothing unallocated counted (ratio 0)
        (MidInputs(allocatable=64000, usage=8000, prod_allocated=0, prod_peak=0), 1.0, 0.0, 0.1, 0),
        # same, with unallocated capacity offered at 50%: all 64 cores are unallocated
        (MidInputs(64000, 8000, 0, 0), 1.0, 0.5, 0.1, 32000),
        # prod asks 40 cores and peaks at 10: 40 - 10*1.1 = 29 reclaimable, the node has 44 unused
        (MidInputs(64000, 20000, 40000, 10000), 1.0, 0.0, 0.1, 29000),
        # ... but only 20 cores are unused on the node: reclaim is capped there
        (MidInputs(64000, 44000, 40000, 10000), 1.0, 0.0, 0.1, 20000),
        # usage above allocatable: nothing unused, nothing reclaimable, unallocated part still counts
        (MidInputs(64000, 70000, 40000, 10000), 1.0, 0.5, 0.1, 12000),
        # threshold: at most 25% of allocatable from reclaim
        (MidInputs(64000, 0, 40000, 0), 0.25, 0.0, 0.0, 16000),
        # peak above the request: no reclaim (max with 0), never negative
        (MidInputs(64000, 10000, 8000, 9000), 1.0, 0.0, 0.1, 0),
        # memory in bytes: 100 Gi requested, 30 Gi peak, margin 0.2 -> 64 Gi, unused 200 Gi
        (MidInputs(256 * GI, 56 * GI, 100 * GI, 30 * GI), 1.0, 0.0, 0.2, 64 * GI),
    ],
)
def test_formula(
    inputs: MidInputs, threshold: float, unallocated: float, margin: float, expected: int
) -> None:
    assert (
        mid_allocatable(inputs, threshold_ratio=threshold, unallocated_ratio=unallocated, safe_margin=margin)
        == expected
    )


def _pod(
    uid: str, priority: int, cpu: int, mem: int, qos: str = "Burstable", phase: str = "Running"
) -> PodInfo:
    return PodInfo(uid, f"ns/{uid}", priority, qos, phase, cpu, mem)


def _write_cgroup(
    root: Path, pod: PodInfo, usage_usec: int, current: int, inactive: int, systemd: bool
) -> None:
    dirs = pod_cgroup_dirs(root, pod.uid, pod.qos)
    d = dirs[0] if systemd else dirs[1]
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.stat").write_text(f"usage_usec {usage_usec}\nuser_usec 1\nsystem_usec 2\n")
    (d / "memory.current").write_text(f"{current}\n")
    (d / "memory.stat").write_text(f"anon 5\ninactive_file {inactive}\nactive_file 7\n")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_usage_from_cgroup_v2_over_a_sliding_window(tmp_path: Path) -> None:
    clock = Clock()
    cfg = MidTierConfig(cgroup_root=str(tmp_path), window_seconds=60, min_samples=2, safe_margin=0.0)
    mid = MidTier(cfg, node_usage=lambda: (10_000, 50 * GI), clock=clock)
    prod_a = _pod("aaaa-1111", 9500, 8000, 16 * GI, qos="Guaranteed")
    prod_b = _pod("bbbb-2222", 9000, 4000, 8 * GI)
    batch = _pod("cccc-3333", 5000, 16000, 32 * GI)  # not prod: ignored
    pods = [prod_a, prod_b, batch]
    _write_cgroup(tmp_path, prod_a, 0, 6 * GI, 1 * GI, systemd=True)
    _write_cgroup(tmp_path, prod_b, 0, 3 * GI, 0, systemd=False)  # the cgroupfs driver layout

    # first sample: no CPU rate yet, so each pod counts its request as its peak -> nothing reclaimed
    first = mid.compute(pods, 64_000, 256 * GI)
    assert first.cpu_milli == 0 and first.memory is not None
    assert first.inputs["cpu"].prod_allocated == 12_000 and first.inputs["cpu"].prod_peak == 12_000

    clock.t += 10  # a uses 2 cores (20 s of CPU in 10 s), b uses 0.5 core
    _write_cgroup(tmp_path, prod_a, 20_000_000, 5 * GI, 1 * GI, systemd=True)
    _write_cgroup(tmp_path, prod_b, 5_000_000, 2 * GI, 0, systemd=False)
    mid.compute(pods, 64_000, 256 * GI)
    clock.t += 10  # a spikes to 4 cores; b idles
    _write_cgroup(tmp_path, prod_a, 60_000_000, 4 * GI, 1 * GI, systemd=True)
    _write_cgroup(tmp_path, prod_b, 5_000_000, 2 * GI, 0, systemd=False)
    result = mid.compute(pods, 64_000, 256 * GI)
    # peaks in the window: a 4000m and 5 GiB (6-1 at the first sample), b 500m and 3 GiB
    assert result.inputs["cpu"].prod_peak == 4500
    assert result.inputs["memory"].prod_peak == 8 * GI
    assert result.cpu_milli == 12_000 - 4500
    assert result.memory == 24 * GI - 8 * GI

    clock.t += 61  # the spike leaves the window; a samples at 1 core from here
    _write_cgroup(tmp_path, prod_a, 121_000_000, 4 * GI, 1 * GI, systemd=True)
    _write_cgroup(tmp_path, prod_b, 5_000_000, 2 * GI, 0, systemd=False)
    mid.compute(pods, 64_000, 256 * GI)
    clock.t += 10
    _write_cgroup(tmp_path, prod_a, 131_000_000, 4 * GI, 1 * GI, systemd=True)
    late = mid.compute(pods, 64_000, 256 * GI)
    assert late.inputs["cpu"].prod_peak == 1000 + 0


def test_missing_inputs_publish_nothing(tmp_path: Path) -> None:
    cfg = MidTierConfig(cgroup_root=str(tmp_path / "absent"))
    prod = [_pod("dddd-4444", 9999, 1000, GI)]
    assert MidTier(cfg, node_usage=lambda: (0, 0)).compute(prod, 1000, GI).cpu_milli is None
    no_usage = MidTier(MidTierConfig(cgroup_root=str(tmp_path)), node_usage=lambda: None)
    result = no_usage.compute([], 1000, GI)
    assert result.cpu_milli is None and result.reason == "node usage not sampled yet"
    unknown_node = MidTier(MidTierConfig(cgroup_root=str(tmp_path)), node_usage=lambda: (0, 0))
    assert unknown_node.compute([], None, GI).memory is None
    # no prod pods at all needs no cgroups: a defined value (0 with the default ratios)
    assert MidTier(cfg, node_usage=lambda: (0, 0)).compute([], 1000, GI).cpu_milli == 0


def test_terminated_and_non_prod_pods_are_not_prod() -> None:
    mid = MidTier(MidTierConfig(), node_usage=lambda: (0, 0))
    assert mid.is_prod(_pod("a", 9000, 1, 1)) and mid.is_prod(_pod("b", 9999, 1, 1))
    assert not mid.is_prod(_pod("c", 10000, 1, 1)) and not mid.is_prod(_pod("d", 8999, 1, 1))


def test_pod_requests_count_like_the_scheduler() -> None:
    pod = {
        "spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                {"resources": {"requests": {"cpu": "1", "memory": "512Mi"}}},
            ],
            "initContainers": [
                {"resources": {"requests": {"cpu": "4", "memory": "100Mi"}}},  # runs alone, before
                {"restartPolicy": "Always", "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}},
            ],
            "overhead": {"cpu": "100m", "memory": "64Mi"},
        }
    }
    cpu, mem = pod_requests(pod)
    assert cpu == 4000 + 100  # the first init container's 4 cores dominate (sidecar starts after it)
    assert mem == (1024 + 512 + 256 + 64) * (1 << 20)
