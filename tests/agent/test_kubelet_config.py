"""kubelet's policies as the agent reads them (agent/kubelet_config.py) and the Node labels it makes
of them (agent/publish/kubelet_labels.py, apis/kubelet_policy.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.config import ConfigError, load_config
from agent.kubelet_config import KubeletConfigReader, KubeletPolicies, KubeletSettings
from agent.publish.kubelet_labels import kubelet_labels, numa_exclusive_cpus
from apis.kubelet_policy import format_numa_cpus, parse_numa_cpus

NUMA = {0: "0-55,112-167", 1: "56-111,168-223"}  # the DGX H100 fixture's


def _reader(tmp_path: Path, doc: dict | str | None, **overrides: str) -> KubeletConfigReader:
    path = tmp_path / "config.yaml"
    if doc is not None:
        path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return KubeletConfigReader(KubeletSettings(config_file=str(path), **overrides))


def test_policies_come_from_kubelets_file(tmp_path: Path) -> None:
    got = _reader(
        tmp_path,
        {
            "kind": "KubeletConfiguration",
            "topologyManagerPolicy": "single-numa-node",
            "topologyManagerScope": "pod",
            "cpuManagerPolicy": "static",
            "reservedSystemCPUs": "0-1,112-113",
        },
    ).policies()
    assert (got.topology_manager_policy, got.topology_manager_scope, got.cpu_manager_policy) == (
        "single-numa-node",
        "pod",
        "static",
    )
    assert got.reserved_cpus == (0, 1, 112, 113) and got.source.endswith("config.yaml")


def test_the_agents_values_win_and_a_missing_file_is_kubelets_defaults(tmp_path: Path) -> None:
    assert _reader(tmp_path, None).policies() == KubeletPolicies(source="kubelet defaults")
    got = _reader(
        tmp_path, None, topology_manager_policy="restricted", cpu_manager_policy="static"
    ).policies()
    assert (got.topology_manager_policy, got.cpu_manager_policy) == ("restricted", "static")


def test_reserved_cpus_by_count_and_a_changed_file_is_read_again(tmp_path: Path) -> None:
    reader = _reader(
        tmp_path,
        {"cpuManagerPolicy": "static", "kubeReserved": {"cpu": "1500m"}, "systemReserved": {"cpu": "1"}},
    )
    assert reader.policies().reserved_cpu_count == 3
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump({"topologyManagerPolicy": "best-effort", "extra": "x" * 9})
    )
    assert reader.policies().topology_manager_policy == "best-effort"


@pytest.mark.parametrize(
    "doc", [{"topologyManagerPolicy": "numa-please"}, {"reservedSystemCPUs": "3-1"}, "- a list"]
)
def test_a_value_kubelet_would_not_take_publishes_no_policy(tmp_path: Path, doc, caplog) -> None:
    reader = _reader(tmp_path, doc)
    got = reader.policies()
    assert got.topology_manager_policy == "none"
    assert any(r.levelname == "WARNING" for r in caplog.records)


def test_agent_config_kubelet_block(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("kubelet:\n  topologyManagerPolicy: single-numa-node\n  configFile: /etc/kubelet.yaml\n")
    cfg = load_config(path)
    assert (cfg.kubelet.topology_manager_policy, cfg.kubelet.config_file) == (
        "single-numa-node",
        "/etc/kubelet.yaml",
    )
    path.write_text("kubelet:\n  topologyPolicy: x\n")
    with pytest.raises(ConfigError, match="unknown key 'topologyPolicy'"):
        load_config(path)


def test_labels(tmp_path: Path) -> None:
    static = KubeletPolicies("restricted", "container", "static", (0, 112), 0)
    assert kubelet_labels(static, NUMA, serving=True) == {
        "node.koordinator.sh/numa-topology-policy": "Restricted",
        "topoalloc.io/topology-manager-scope": "container",
        "topoalloc.io/cpu-manager-policy": "static",
        "topoalloc.io/numa-cpus": "0.112.110_1.112.112",
    }
    # reserved by count: taken from the lowest NUMA nodes first
    assert numa_exclusive_cpus(
        NUMA, KubeletPolicies(cpu_manager_policy="static", reserved_cpu_count=114)
    ) == {
        0: (112, 0),
        1: (112, 110),
    }
    # no policy, or no device plugins to align: every label removed
    removed = dict.fromkeys(kubelet_labels(static, NUMA, serving=True))
    assert kubelet_labels(KubeletPolicies(), NUMA, serving=True) == removed
    assert kubelet_labels(static, NUMA, serving=False) == removed
    # without the static CPU manager there are no pinned CPUs to publish
    none_cpu = KubeletPolicies("best-effort", "pod", "none")
    assert kubelet_labels(none_cpu, NUMA, serving=True)["topoalloc.io/numa-cpus"] is None


def test_numa_cpus_codec() -> None:
    assert parse_numa_cpus(format_numa_cpus({0: (112, 110), 1: (112, 112)}) or "") == {
        0: (112, 110),
        1: (112, 112),
    }
    assert format_numa_cpus({n: (999, 999) for n in range(8)}) is None  # over 63 characters: not published
    for bad in ("0.1", "0.1.2_0.1.2", "0.1.5", "a.b.c"):
        assert parse_numa_cpus(bad) == {}
