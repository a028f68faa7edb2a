"""`install --monitoring`: the monitoring component rendered into the installation (labelled like
the rest, in every mode), recorded for `upgrade`, known to uninstall and prune, and off by
default; `--dry-run --kube-version` renders it without a cluster."""

from __future__ import annotations

from typing import Any

import yaml
from click.testing import CliRunner

from topoalloc.cli import main
from topoalloc.commands.installer import manifests
from topoalloc.commands.installer.manifests import MONITORING_KINDS, ClusterFacts, InstallOptions, render

MONITORING = {("ServiceMonitor", "topoalloc-allocator"), ("PodMonitor", "topoalloc-agent"),
              ("PrometheusRule", "topoalloc"), ("ConfigMap", "topoalloc-dashboard")}  # fmt: skip


def _names(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def test_off_by_default_and_added_in_every_mode_with_the_option() -> None:
    assert not _names(render(InstallOptions("1.0.0"), ClusterFacts())) & MONITORING
    for mode in manifests.MODES:
        opts = InstallOptions("1.0.0", mode=mode, monitoring=True, scheduler_version="v1.35.6")
        docs = [d for d in render(opts, ClusterFacts()) if (d["kind"], d["metadata"]["name"]) in MONITORING]
        assert _names(docs) == MONITORING, mode
        for doc in docs:
            assert doc["metadata"]["namespace"] == manifests.NAMESPACE
            assert doc["metadata"]["labels"][manifests.MANAGED_BY] == manifests.MANAGER
    dashboard = next(d for d in docs if d["kind"] == "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_the_choice_is_recorded_and_uninstall_knows_the_kinds() -> None:
    opts = InstallOptions("1.0.0", monitoring=True)
    assert opts.record()["monitoring"] == "true"
    assert InstallOptions.from_record(opts.record()).monitoring is True
    assert InstallOptions.from_record(InstallOptions("1.0.0").record()).monitoring is False
    known = set(manifests.kinds())
    assert {(manifests.MONITORING_API, k) for k in MONITORING_KINDS} <= known


def test_gitops_render_with_monitoring() -> None:
    args = ["install", "--dry-run", "--kube-version", "v1.35.6", "--monitoring", "--certs", "cert-manager"]
    ran = CliRunner().invoke(main, args)
    assert ran.exit_code == 0, ran.output
    assert _names([d for d in yaml.safe_load_all(ran.stdout) if d]) >= MONITORING
