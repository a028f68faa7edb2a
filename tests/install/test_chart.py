"""The Helm chart (charts/topoalloc) against the installer: generated files current, `helm lint`
and `helm template` clean, the same objects as `topoalloc install` renders for the same values,
and a typo refused by both. helm comes from tests/support/helm.py (a PyPI wheel)."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tests.support.helm import require_helm
from topoalloc.cli import main
from topoalloc.commands.installer import chartfiles
from topoalloc.commands.installer.kustomize import ident
from topoalloc.commands.installer.manifests import ClusterFacts, InstallOptions, render
from topoalloc.commands.installer.options import with_values
from topoalloc.commands.installer.values import ValuesError, schema

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "topoalloc"
VALUES = Path(__file__).parent / "chart-values"
CASES = {
    "default": [],
    "every-option": [VALUES / "every-option.yaml"],
    "kubeadm-cert-manager": [VALUES / "kubeadm-cert-manager.yaml"],
}
KUBE = "v1.35.6"
DUMMY_TLS = {
    name: {"tls.crt": b"c", "tls.key": b"k", "ca.crt": b"a"}
    for name in ("topoalloc-allocator-tls", "topoalloc-scheduler-client")
}


@pytest.fixture(scope="module", params=[4, 3], ids=lambda major: f"helm{major}")
def helm(request: pytest.FixtureRequest) -> Path:
    return require_helm(request.param)


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)


def helm_template(helm: Path, files: list[Path], *extra: str) -> list[dict[str, Any]]:
    # resource.k8s.io/v1 as a 1.34+ server serves it (helm 3.17 does not know it offline)
    args = [
        "template",
        "topoalloc",
        str(CHART),
        "--kube-version",
        KUBE,
        "--include-crds",
        "--api-versions",
        "resource.k8s.io/v1",
    ]
    for path in files:
        args += ["-f", str(path)]
    done = run_helm(helm, *args, *extra)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def installer_render(files: list[Path]) -> list[dict[str, Any]]:
    options = with_values(InstallOptions(version="0.1.0"), files)
    if options.mode == "secondary" and not options.scheduler_version:
        options = InstallOptions(**{**options.__dict__, "scheduler_version": KUBE})
    tls = DUMMY_TLS if options.certs == "generate" else None
    return render(options, ClusterFacts(tls=copy.deepcopy(tls), dra_served=True), ROOT)


def normalised(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], Any]:
    """Objects by identity, less what is meant to differ: who manages them (the labels
    `managed-by: topoalloc` / `Helm` and `helm.sh/chart`), the installer's record ConfigMap, and
    the random certificates (their Secrets' files and the webhook's caBundle: present, not equal)."""
    out = {}
    for doc in docs:
        doc = copy.deepcopy(doc)
        labels = doc["metadata"].get("labels") or {}
        for key in ("app.kubernetes.io/managed-by", "helm.sh/chart"):
            labels.pop(key, None)
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "topoalloc-install":
            continue
        if doc["kind"] == "Secret":
            doc["data"] = sorted(doc["data"])
        for hook in doc.get("webhooks") or []:
            if "caBundle" in hook.get("clientConfig", {}):
                hook["clientConfig"]["caBundle"] = "<ca>"
        out[ident(doc)] = doc
    return out


def test_generated_files_are_current() -> None:
    assert chartfiles.stale(ROOT) == [], "run `make chart`"


def test_schema_file_is_the_loaders_schema() -> None:
    assert json.loads((CHART / "values.schema.json").read_text()) == schema()


@pytest.mark.parametrize("case", sorted(CASES))
def test_lint_and_template(helm: Path, case: str) -> None:
    args = ["lint", "--strict", str(CHART), "--kube-version", KUBE]
    for path in CASES[case]:
        args += ["-f", str(path)]
    done = run_helm(helm, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    kinds = {d["kind"] for d in helm_template(helm, CASES[case])}
    assert {"CustomResourceDefinition", "Deployment", "DaemonSet", "MutatingWebhookConfiguration"} <= kinds


@pytest.mark.parametrize("case", sorted(CASES))
def test_chart_renders_what_the_installer_renders(helm: Path, case: str) -> None:
    chart = normalised(helm_template(helm, CASES[case]))
    installer = normalised(installer_render(CASES[case]))
    assert sorted(chart) == sorted(installer)
    for key in chart:
        assert chart[key] == installer[key], key


def test_every_option_reaches_the_objects(helm: Path) -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in helm_template(helm, CASES["every-option"])}
    pool = docs["DaemonSet", "topoalloc-agent-dra"]["spec"]["template"]
    assert pool["spec"]["nodeSelector"] == {"topoalloc.io/agent-pool": "dra"}
    assert json.loads(docs["ConfigMap", "topoalloc-agent-dra"]["data"]["agent.yaml"])["mode"] == "dra"
    default = docs["DaemonSet", "topoalloc-agent"]["spec"]["template"]["spec"]
    for term in default["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]:
        assert {"key": "topoalloc.io/agent-pool", "operator": "NotIn", "values": ["dra"]} in term[
            "matchExpressions"
        ]
    assert default["runtimeClassName"] == "nvidia"
    allocator = json.loads(docs["ConfigMap", "topoalloc-allocator"]["data"]["allocator.yaml"])
    assert allocator["roundTrips"] == 2 and allocator["defrag"] == {"enabled": True, "dryRun": False}
    assert allocator["placement"]["preemption"] is True  # the shipped settings stay beside the values
    hooks = {h["name"]: h for h in docs["MutatingWebhookConfiguration", "topoalloc-gang"]["webhooks"]}
    assert hooks["podgroup.gang.topoalloc.io"]["failurePolicy"] == "Fail"


def test_the_namespace_is_the_charts_unless_the_release_lives_in_it(helm: Path) -> None:
    def namespaces(*extra: str) -> list[str]:
        return [d["metadata"]["name"] for d in helm_template(helm, [], *extra) if d["kind"] == "Namespace"]

    assert namespaces() == ["topoalloc-system"]  # `helm install topoalloc charts/topoalloc`
    assert namespaces("--namespace", "topoalloc-system") == []  # made by `--create-namespace`


def test_scheduler_pinned_to_the_servers_version(helm: Path) -> None:
    docs = helm_template(helm, [], "--set", "mode=secondary", "--kube-version", "v1.34.3-eks-1a2b")
    scheduler = next(
        d for d in docs if d["metadata"]["name"] == "topoalloc-scheduler" and d["kind"] == "Deployment"
    )
    images = [c["image"] for c in scheduler["spec"]["template"]["spec"]["containers"]]
    assert images == ["registry.k8s.io/kube-scheduler:v1.34.3"]


@pytest.mark.parametrize(
    "assignment",
    [
        # typos
        "allocator.config.roundTrip=2",
        "agent.config.mod=dra",
        "agent.pools.dra.nodeSelectr.a=b",
        "mod=kubeadm",
        # choices and bounds the loaders declare
        "allocator.config.roundTrips=3",
        "agent.config.mode=gpu",
        "allocator.config.scarceAvoidance.weight=500",
        "allocator.config.placement.pin=sticky",
        "allocator.config.defrag.interval=0",
        "allocator.config.defrag.maxMigrating=-1",
        "allocator.config.gang.topologyProfile=moon",
    ],
)
def test_a_bad_value_is_refused_by_helm_and_by_install(helm: Path, assignment: str) -> None:
    key = assignment.split("=")[0].split(".")[-1]
    done = run_helm(helm, "template", "t", str(CHART), "--kube-version", KUBE, "--set", assignment)
    assert done.returncode != 0 and "schema" in done.stderr.lower(), done.stderr
    with pytest.raises(ValuesError, match=key):
        with_values(InstallOptions(version="0"), sets=[assignment])
    result = CliRunner().invoke(main, ["install", "--dry-run", "--kube-version", KUBE, "--set", assignment])
    assert result.exit_code != 0 and key in result.output


def test_a_check_only_the_loader_makes_is_refused_by_install() -> None:
    # Not expressible in the schema (it depends on `enabled`): the loader itself refuses it.
    with pytest.raises(ValuesError, match="nodeLabels"):
        with_values(InstallOptions(version="0"), sets=["allocator.config.scarceAvoidance.nodeLabels=[]"])


def test_settings_change_rolls_only_the_pool_concerned(helm: Path) -> None:
    def sums(*sets: str) -> dict[str, str]:
        extra = [a for s in sets for a in ("--set", s)]
        docs = helm_template(helm, [VALUES / "every-option.yaml"], *extra)
        return {
            d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for d in docs
            if d["kind"] in ("DaemonSet", "Deployment") and d["metadata"]["name"] != "topoalloc-scheduler"
        }

    before = sums()
    after = sums("agent.pools.dra.config.resyncSeconds=5")
    assert {k for k in before if before[k] != after[k]} == {"topoalloc-agent-dra"}
    after = sums("allocator.config.defrag.dryRun=true")
    assert {k for k in before if before[k] != after[k]} == {"topoalloc-allocator"}


def test_release_yaml_renders() -> None:
    from topoalloc.commands.installer.release import release_files

    files = release_files("0.1.0", ROOT)
    assert sorted(files) == ["topoalloc-0.1.0-cert-manager.yaml", "topoalloc-0.1.0.yaml"]
    for name, text in files.items():
        docs = [d for d in yaml.safe_load_all(text) if d]
        kinds = {d["kind"] for d in docs}
        assert {
            "CustomResourceDefinition",
            "Deployment",
            "DaemonSet",
            "MutatingWebhookConfiguration",
        } <= kinds
        assert "Secret" not in kinds  # no private key in a file meant for git
        assert ("Certificate" in kinds) == name.endswith("cert-manager.yaml")
        images = {
            c["image"]
            for d in docs
            if d["kind"] in ("Deployment", "DaemonSet")
            for c in d["spec"]["template"]["spec"]["containers"]
        }
        assert images == {"topoalloc:0.1.0"}


def test_upgrade_keeps_the_recorded_settings_and_lays_new_ones_on_them() -> None:
    first = with_values(
        InstallOptions(version="0.1.0"),
        sets=["agent.pools.dra.nodeSelector.pool=dra", "agent.pools.dra.config.mode=dra", "mode=secondary"],
    )
    recorded = InstallOptions.from_record(first.record())  # what `upgrade` reads back
    assert recorded == first
    later = with_values(
        recorded, sets=["allocator.config.roundTrips=2", "agent.pools.dra.config.resyncSeconds=5"]
    )
    assert later.mode == "secondary"
    assert later.settings() == {
        "agent": {
            "pools": {"dra": {"nodeSelector": {"pool": "dra"}, "config": {"mode": "dra", "resyncSeconds": 5}}}
        },
        "allocator": {"config": {"roundTrips": 2}},
    }
    names = {d["metadata"]["name"] for d in render(later, ClusterFacts(), ROOT) if d["kind"] == "DaemonSet"}
    assert names == {"topoalloc-agent", "topoalloc-agent-dra"}


def test_set_reads_keys_and_lists_as_helm_does(helm: Path) -> None:
    sets = [
        r"agent.pools.dra.nodeSelector.topoalloc\.io/agent-pool=dra",
        "allocator.config.gang.schedulerNames={a,b}",
    ]
    extra = [a for s in sets for a in ("--set", s)]
    chart = normalised(helm_template(helm, [], *extra))
    options = with_values(InstallOptions(version="0.1.0"), sets=sets)
    installer = normalised(render(options, ClusterFacts(tls=copy.deepcopy(DUMMY_TLS), dra_served=True), ROOT))
    assert chart == installer
    assert options.settings()["allocator"]["config"]["gang"]["schedulerNames"] == ["a", "b"]


def test_null_takes_a_pool_away() -> None:
    first = with_values(InstallOptions(version="0"), sets=["agent.pools.dra.nodeSelector.pool=dra"])
    later = with_values(first, sets=["agent.pools.dra=null"])
    assert later.settings() == {"agent": {"pools": {}}}
