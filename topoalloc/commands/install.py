"""`topoalloc install`, `upgrade` and `uninstall`: put topoalloc on the cluster a kubeconfig names,
and take it off again without harm (topoalloc/commands/installer/, docs/install.md)."""

from __future__ import annotations

import importlib.metadata
import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import click

from topoalloc.commands.cleanup import agents_gone_timeout
from topoalloc.commands.doctor.command import Duration
from topoalloc.commands.installer.kustomize import KustomizeError, dump
from topoalloc.commands.installer.manifests import (
    CERTS,
    FAILURE_POLICIES,
    MODES,
    InstallOptions,
    missing_bases,
    repo_root,
)
from topoalloc.commands.installer.report import Report
from topoalloc.commands.kube_access import DEFAULT_WITH_FLAG
from topoalloc.errors import BadInput, Failure

F = TypeVar("F", bound=Callable[..., Any])


def _package_version() -> str:
    return importlib.metadata.version("topoalloc")


def cluster_options(func: F) -> F:
    """--kubeconfig, --context, --in-cluster, --manifests: the same on the three commands."""
    for option in reversed(
        [
            click.option("--kubeconfig", help=f"kubeconfig file ({DEFAULT_WITH_FLAG})."),
            click.option("--context", help="kubeconfig context (default: its current context)."),
            click.option("--in-cluster", is_flag=True, help="Use the pod's service account."),
            click.option(
                "--manifests",
                type=click.Path(file_okay=False, path_type=Path),
                help="Folder holding the deploy/ and daemonset/ kustomize bases (default: the package's own "
                "copy, or this checkout's).",
            ),
        ]
    ):
        func = option(func)
    return func


def _root(manifests: Path | None) -> Path:
    root = manifests or repo_root()
    missing = missing_bases(root)
    if missing:
        raise BadInput(
            "manifests",
            str(root),
            f"no {' or '.join(missing)} kustomize base here; run from a topoalloc checkout or pass "
            "--manifests",
        )
    return root


def _connect(kubeconfig: str | None, context: str | None, in_cluster: bool) -> Any:
    from topoalloc.commands.installer.cluster import open_cluster

    return open_cluster(kubeconfig, context, in_cluster)


def _print(report: Report, *, results_to_stderr: bool = False) -> None:
    for line in report.lines:
        click.echo(line, err=results_to_stderr)
    for line in report.warnings:
        click.echo(f"warning: {line}", err=True)


def _print_docs(docs: list[dict[str, Any]], output: str) -> None:
    if output == "json":
        click.echo(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}, indent=2))
    else:
        click.echo(dump(docs), nl=False)


def _guarded(func: Callable[[], Any], host: str = "") -> Any:
    """A base that does not render is bad input; an API error nobody expected (RBAC refusing the
    user, a webhook of the cluster refusing an object) is a runtime failure, said in one line."""
    from topoalloc.commands.installer.cluster import ApiError

    try:
        return func()
    except KustomizeError as exc:
        raise BadInput("manifests", str(exc.where), exc.why) from None
    except ApiError as exc:
        raise Failure("cluster", host, str(exc)) from None


OPTION_FLAGS = [
    click.option("--version", "version", help="topoalloc version: the image tag.  [default: this package's]"),
    click.option(
        "--image", help="topoalloc image repository (`make image-push IMAGE=...`).  [default: topoalloc]"
    ),
    click.option(
        "--mode",
        type=click.Choice(MODES),
        help="placement: every GPU pod placed at admission and bound by the cluster's own kube-scheduler, "
        "unchanged (any cluster, managed ones included); secondary: a second kube-scheduler calling the "
        "extender (pods opt in by schedulerName); kubeadm: the cluster's own kube-scheduler calls the "
        "extender, configured by files this writes.  [default: placement]",
    ),
    click.option(
        "--certs",
        type=click.Choice(CERTS),
        help="generate: the installer makes the CA and certificates into the Secrets; cert-manager: "
        "cert-manager issues them.  [default: generate]",
    ),
    click.option(
        "--gang-webhook-failure-policy",
        "gang_failure_policy",
        type=click.Choice(FAILURE_POLICIES),
        help="What the API server does with a gang member while no allocator answers: Ignore admits it "
        "ungated (an extender holds it until its gang is placed), Fail refuses it.  [default: Fail in "
        "placement mode, else Ignore]",
    ),
    click.option(
        "--scheduler-version",
        help="Secondary scheduler: kube-scheduler version (vX.Y.Z) within the skew policy.  "
        "[default: the server's exact version]",
    ),
    click.option(
        "--scheduler-image",
        help="Secondary scheduler: kube-scheduler image repository.  "
        "[default: registry.k8s.io/kube-scheduler]",
    ),
    click.option(
        "--nvidia-runtime-class/--no-nvidia-runtime-class",
        default=None,
        help="Run the agent with runtimeClassName: nvidia (where the NVIDIA runtime is not the default).",
    ),
    click.option(
        "--monitoring/--no-monitoring",
        default=None,
        help="Add the Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule (alerts with "
        "runbooks) and the Grafana dashboard ConfigMap (deploy/components/monitoring); needs the "
        "monitoring.coreos.com CRDs.  [default: off]",
    ),
    click.option(
        "--values",
        "values_files",
        multiple=True,
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        help="A values file of the Helm chart (charts/topoalloc/values.yaml: settings of the allocator "
        "and the agents, agent pools, the choices above); repeatable, later files win. Recorded: "
        "`upgrade` keeps them.",
    ),
    click.option(
        "--set",
        "value_sets",
        multiple=True,
        metavar="KEY=VALUE",
        help="One chart value, e.g. agent.config.mode=dra or allocator.config.defrag.enabled=true; "
        "repeatable, after --values.",
    ),
    click.option(
        "--reset-values",
        is_flag=True,
        help="Drop the recorded settings and agent pools; start from the shipped configuration.",
    ),
]

RUN_FLAGS = [
    click.option(
        "--gpu-nodes",
        help="Comma-separated nodes to label topoalloc.io/gpu-node=true, for GPU nodes without GPU or "
        "Node Feature Discovery labels (the agent runs only on labelled nodes).",
    ),
    click.option("--gpu-node-selector", help="Label the nodes this label selector picks, as --gpu-nodes."),
    click.option(
        "--rotate-certs", is_flag=True, help="Issue new certificates even if the Secrets are valid."
    ),
    click.option(
        "--force-conflicts",
        is_flag=True,
        help="Take over fields someone changed outside topoalloc (each is named); without it such a "
        "run applies nothing.",
    ),
    click.option("--dry-run", is_flag=True, help="Print the manifests (-o) instead of applying them."),
    click.option(
        "--wait",
        is_flag=True,
        help="Then wait for the agent and the allocator to roll out and run `topoalloc doctor` on the "
        "installation (exit 1 when a check fails).",
    ),
    click.option(
        "--timeout",
        type=Duration(),
        default="5m",
        show_default=True,
        help="With --wait: how long the rollout and doctor may take in all.",
    ),
    click.option(
        "-o",
        "--output",
        type=click.Choice(["yaml", "json"]),
        default="yaml",
        show_default=True,
        help="With --dry-run: the manifests as YAML documents or a JSON List.",
    ),
    click.option(
        "--kubeadm-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("topoalloc-kubeadm"),
        show_default=True,
        help="--mode kubeadm: where to write kube-scheduler's files.",
    ),
]


def _with(flags: list[Callable[[F], F]]) -> Callable[[F], F]:
    def apply(func: F) -> F:
        for flag in reversed(flags):
            func = flag(func)
        return func

    return apply


def _options(base: InstallOptions, flags: dict[str, Any]) -> InstallOptions:
    """`base`, then the chart values given (--values, --set), then the flags."""
    from topoalloc.commands.installer.options import with_values
    from topoalloc.commands.installer.values import ValuesError

    if flags.get("reset_values"):
        base = replace(base, values="")
    try:
        base = with_values(base, flags.get("values_files") or (), flags.get("value_sets") or ())
    except (ValuesError, OSError) as exc:
        raise BadInput("values", "--values/--set", str(exc)) from None
    changes = {k: v for k, v in flags.items() if v is not None and k in InstallOptions.__dataclass_fields__}
    return InstallOptions(**{**base.__dict__, **changes})


def _check_wait(flags: dict[str, Any]) -> None:
    if flags["wait"] and flags["dry_run"]:
        raise click.UsageError("--wait waits for what was applied: not with --dry-run")


def _request(flags: dict[str, Any]) -> Any:
    from topoalloc.commands.installer.lifecycle import Request

    nodes = tuple(n.strip() for n in (flags.get("gpu_nodes") or "").split(",") if n.strip())
    return Request(
        gpu_nodes=nodes,
        gpu_node_selector=flags.get("gpu_node_selector") or "",
        rotate_certs=flags["rotate_certs"],
        force_conflicts=flags["force_conflicts"],
        dry_run=flags["dry_run"],
        kubeadm_dir=flags["kubeadm_dir"],
    )


def _deploy(cluster: Any, options: InstallOptions, flags: dict[str, Any], root: Path) -> None:
    from topoalloc.commands.certs import unignored_private_keys
    from topoalloc.commands.installer.lifecycle import deploy

    outcome = _guarded(lambda: deploy(cluster, options, _request(flags), root), cluster.host)
    if flags["dry_run"]:
        _print(outcome.report, results_to_stderr=True)
        _print_docs(outcome.docs, flags["output"])
        if any(d["kind"] == "Secret" for d in outcome.docs):
            click.echo(
                "warning: the output holds private keys (the TLS Secrets); keep it out of git", err=True
            )
        return
    _print(outcome.report)
    for line in unignored_private_keys([p for p in outcome.written if p.suffix == ".key"]):
        click.echo(f"warning: {line}", err=True)
    if flags["wait"]:
        _wait(cluster, outcome.docs, root, flags)


def _wait(cluster: Any, docs: list[dict[str, Any]], root: Path, flags: dict[str, Any]) -> None:
    """The rollout, then doctor's report; exit 1 when one of its checks fails."""
    from topoalloc.commands.doctor.findings import Summary
    from topoalloc.commands.doctor.report import render
    from topoalloc.commands.doctor.rollout import wait_and_check

    facts, findings = _guarded(
        lambda: wait_and_check(cluster, docs, root, flags["timeout"], flags["kubeadm_dir"], click.echo),
        cluster.host,
    )
    click.echo(render(facts, findings), nl=False)
    click.get_current_context().exit(Summary.of(findings).exit_status)


@click.command("install")
@_with(OPTION_FLAGS)
@_with(RUN_FLAGS)
@click.option(
    "--kube-version",
    help="With --dry-run: render for this Kubernetes version without contacting a cluster (GitOps).",
)
@cluster_options
def install(kube_version: str | None, manifests: Path | None, **flags: Any) -> None:
    """Install topoalloc on the cluster: CRDs, the node agent, the allocator, kube-scheduler's
    hook-up and certificates, applied with server-side apply (or printed with --dry-run).

    \b
    Says which nodes the agent will run on, labels GPU nodes that lack GPU labels (--gpu-nodes),
    and warns about an NVIDIA device plugin on those nodes. Re-running it is safe: it starts from
    the choices recorded by the last run (flags change them), applies the same objects and removes
    those it made that no longer belong.
    """
    from topoalloc.commands.installer.record import recorded_options

    _check_wait(flags)
    root = _root(manifests)
    fresh = InstallOptions(version=_package_version())
    if kube_version is not None:
        if not flags["dry_run"] or flags["wait"]:
            raise click.UsageError("--kube-version renders without a cluster: it needs --dry-run, not --wait")
        _offline(_options(fresh, flags), kube_version, root, flags["output"])
        return
    cluster = _connect(flags["kubeconfig"], flags["context"], flags["in_cluster"])
    # Installed already: the recorded choices stand unless a flag changes them (the version is
    # this package's, or --version; the scheduler follows the server again).
    recorded = _guarded(lambda: recorded_options(cluster), cluster.host)
    base = replace(recorded, version=fresh.version, scheduler_version="") if recorded else fresh
    _deploy(cluster, _options(base, flags), flags, root)


def _offline(options: InstallOptions, kube_version: str, root: Path, output: str) -> None:
    from topoalloc.commands.installer import lifecycle, tls, versions
    from topoalloc.commands.installer.manifests import ClusterFacts, render

    try:
        server = versions.KubeVersion.parse(kube_version)
    except ValueError as exc:
        raise BadInput("--kube-version", kube_version, str(exc)) from None
    if (why := versions.server_refusal(server)) is not None:
        raise BadInput("--kube-version", kube_version, why)
    if (note := versions.server_warning(server)) is not None:  # as an install on such a cluster says
        click.echo(f"warning: {note}", err=True)
    options = lifecycle.pin_scheduler(options, server, options.scheduler_version)
    facts = ClusterFacts(tls=tls.issue_secrets() if options.certs == "generate" else None)
    facts.dra_served = server >= versions.KubeVersion(1, 34)  # resource.k8s.io/v1
    docs = _guarded(lambda: render(options, facts, root))
    _print_docs(docs, output)
    if options.certs == "generate":
        click.echo("warning: the output holds private keys (the TLS Secrets); keep it out of git", err=True)


@click.command("upgrade")
@_with(OPTION_FLAGS)
@_with(RUN_FLAGS)
@click.option(
    "--allow-downgrade",
    is_flag=True,
    help="Go to a version lower than the installed one (refused without it).",
)
@cluster_options
def upgrade(manifests: Path | None, allow_downgrade: bool, **flags: Any) -> None:
    """Upgrade an installation to this package's version (or --version): re-render from the options
    the last install recorded, apply, and let the agent DaemonSet and the allocator Deployment
    roll. Allocations stay: they live in the pods' annotations and the agents' checkpoints."""
    from topoalloc.commands.installer.record import recorded_options

    _check_wait(flags)
    root = _root(manifests)
    cluster = _connect(flags["kubeconfig"], flags["context"], flags["in_cluster"])
    recorded = _guarded(lambda: recorded_options(cluster), cluster.host)
    if recorded is None:
        raise BadInput(
            "upgrade",
            cluster.host,
            "no installation found (no ConfigMap topoalloc-system/topoalloc-install): run topoalloc install",
        )
    base = replace(recorded, version=_package_version(), scheduler_version="")  # the server's, read again
    options = _options(base, flags)
    _check_downgrade(recorded.version, options.version, allow_downgrade)
    if not flags["dry_run"]:
        click.echo(f"upgrade: {recorded.image}:{recorded.version} -> {options.image}:{options.version}")
    _deploy(cluster, options, flags, root)


def _check_downgrade(installed: str, wanted: str, allowed: bool) -> None:
    """A lower version than the installed one only when asked for (PEP 440 order: 0.1.10 is newer
    than 0.1.9, 0.2.0rc1 older than 0.2.0); tags that are no versions cannot be ordered and pass."""
    from packaging.version import InvalidVersion, Version

    try:
        lower = Version(wanted) < Version(installed)
    except InvalidVersion:
        click.echo(f"warning: cannot order versions {installed!r} and {wanted!r}; upgrading anyway", err=True)
        return
    if lower and not allowed:
        raise BadInput(
            "upgrade",
            f"{installed} -> {wanted}",
            f"{wanted} is older than the installed {installed}: a downgrade; pass --allow-downgrade to "
            "go back to it (its manifests must know every setting the installation has)",
        )
    if lower:
        click.echo(f"warning: downgrading from {installed} to {wanted} (--allow-downgrade)", err=True)


def _recorded_defaults(command: click.Command) -> click.Command:
    """`upgrade` starts from the installation's recorded choices, not install's defaults: its help
    says so instead of install's `[default: ...]`."""
    # the version is this package's and the scheduler follows the server again: install's help holds
    recorded = set(InstallOptions.__dataclass_fields__) - {"version", "scheduler_version"}
    for param in command.params:
        if isinstance(param, click.Option) and param.name in recorded:
            help_text = re.sub(r"\s*\[default: [^\]]*\]$", "", param.help or "")
            param.help = f"{help_text}  [default: as the installation recorded it]"
    return command


_recorded_defaults(upgrade)


@click.command("uninstall")
@click.option(
    "--purge",
    is_flag=True,
    help="Also delete the CRDs the installer created, with every Device, PodGroup and Reservation, and the "
    "topoalloc.io/gpu-node label from the nodes.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@agents_gone_timeout
@cluster_options
def uninstall(
    purge: bool,
    dry_run: bool,
    timeout: float,
    kubeconfig: str | None,
    context: str | None,
    in_cluster: bool,
    manifests: Path | None,
) -> None:
    """Remove what `topoalloc install` created: the webhooks first, then the workloads, RBAC and
    Secrets, and the namespace if the installer created it; then, once the agent pods are gone, what
    they left (`topoalloc cleanup`: Node labels and resources, ResourceSlices, DeviceClasses, and
    topoalloc's scheduling gates on pods). CRDs and their objects stay unless --purge; a CRD or
    namespace the installer did not create is never deleted.

    \b
    Exit status: 0 when everything went, 1 when something could not be removed (said on stderr).
    """
    from topoalloc.commands.cleanup import print_cleanup
    from topoalloc.commands.installer.removal import uninstall as remove

    root = _root(manifests)
    cluster = _connect(kubeconfig, context, in_cluster)
    done = _guarded(
        lambda: remove(cluster, purge=purge, dry_run=dry_run, root=root, timeout=timeout), cluster.host
    )
    click.get_current_context().exit(print_cleanup(done))
