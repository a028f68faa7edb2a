"""The agent's own metrics on a real DRA bed: claim prepares counted by result as kubelet asks over
gRPC, the node's devices by health after a critical Xid, and the metrics listener serving
/metrics alone while the loopback health listener keeps /status."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import REGISTRY

from agent.config import ConfigError, load_config
from agent.healthz import METRICS_ONLY, HealthServer
from tests.agent.dra.rig import DraRig
from tests.agent.support import wait_for
from tests.support.dra_kubelet import PrepareError


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_prepares_are_counted_by_result(rig: DraRig) -> None:
    assert rig.kubelet is not None
    ok, failed = (
        sample("topoalloc_agent_claim_prepares_total", result="prepared"),
        sample("topoalloc_agent_claim_prepares_total", result="failed"),
    )
    pod, _ = rig.claim_pod("p", "c1", ["gpu-1"])
    rig.kubelet.prepare(pod)
    assert sample("topoalloc_agent_claim_prepares_total", result="prepared") == ok + 1
    bad, _ = rig.claim_pod("q", "c2", ["gpu-99"])  # no such device on the node
    with pytest.raises(PrepareError, match="has no device gpu-99"):
        rig.kubelet.prepare(bad)
    assert sample("topoalloc_agent_claim_prepares_total", result="failed") == failed + 1
    assert sample("topoalloc_agent_claim_prepares_total", result="prepared") == ok + 1


def test_devices_by_health_follow_a_critical_xid(rig: DraRig) -> None:
    assert rig.fx is not None and rig.agent is not None
    assert wait_for(lambda: sample("topoalloc_agent_devices", type="gpu", health="healthy") == 8, 10)
    assert sample("topoalloc_agent_devices", type="gpu", health="unhealthy") == 0
    assert wait_for(lambda: rig.agent.events.ready.is_set(), 10)
    rig.fx.nvml.emit(3, 79)  # fallen off the bus
    assert wait_for(lambda: sample("topoalloc_agent_devices", type="gpu", health="unhealthy") == 1, 10)
    assert sample("topoalloc_agent_devices", type="gpu", health="healthy") == 7


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_the_metrics_listener_answers_metrics_alone() -> None:
    state = {"live": True, "ready": True, "pods": ["default/secret-training"]}
    metrics = HealthServer("127.0.0.1", 0, lambda: state, paths=METRICS_ONLY, name="metrics")
    health = HealthServer("127.0.0.1", 0, lambda: state)
    metrics.start()
    health.start()
    try:
        status, text = _get(f"http://127.0.0.1:{metrics.port}/metrics")
        assert status == 200 and "topoalloc_agent_claim_prepares_total" in text
        for path in ("/status", "/healthz", "/readyz"):
            assert _get(f"http://127.0.0.1:{metrics.port}{path}")[0] == 404, path
            assert _get(f"http://127.0.0.1:{health.port}{path}")[0] == 200, path
        assert "secret-training" in _get(f"http://127.0.0.1:{health.port}/status")[1]
    finally:
        metrics.stop()
        health.stop()


def test_the_metrics_setting_is_read_and_checked(tmp_path) -> None:
    path = tmp_path / "agent.yaml"
    assert (load_config(None).metrics.address, load_config(None).metrics.port) == ("0.0.0.0", 9824)
    path.write_text("metrics:\n  address: 10.0.0.7\n  port: 9900\n  enabled: false\n")
    cfg = load_config(path)
    assert (cfg.metrics.address, cfg.metrics.port, cfg.metrics.enabled) == ("10.0.0.7", 9900, False)
    path.write_text("metrics:\n  port: 70000\n")
    with pytest.raises(ConfigError, match=r"metrics\.port"):
        load_config(path)
    path.write_text("metrics:\n  adress: 10.0.0.7\n")
    with pytest.raises(ConfigError, match="unknown key 'adress'"):
        load_config(path)
