"""`topoalloc cleanup`: remove topoalloc's traces that are no manifest's objects (the agent's Node
labels and status resources, ResourceSlices, DeviceClasses, scheduling gates), after stopping the
webhooks and the agents (topoalloc/commands/installer/cleanup.py). `uninstall` runs it; so does the
Helm chart's pre-delete hook, in the cluster."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from topoalloc.commands.doctor.command import Duration
from topoalloc.commands.kube_access import DEFAULT_WITH_FLAG
from topoalloc.errors import EXIT_FAILURE, EXIT_OK

if TYPE_CHECKING:
    from topoalloc.commands.installer.cleanup import Cleanup

POD_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def print_cleanup(result: Cleanup) -> int:
    """Print what a cleanup did, then what it could not do (stderr); the exit status."""
    for line in result.report.lines:
        click.echo(line)
    for line in result.report.warnings:
        click.echo(f"warning: {line}", err=True)
    return EXIT_FAILURE if result.problems else EXIT_OK


# Shared with `uninstall`, which runs the same cleanup.
agents_gone_timeout = click.option(
    "--timeout",
    type=Duration(),
    default="2m",
    show_default=True,
    help="How long to wait for the agent pods to be gone before cleaning their nodes.",
)


@click.command("cleanup")
@click.option(
    "--namespace",
    help="Where the agent DaemonSets run.  [default: the pod's own namespace with --in-cluster, else "
    "topoalloc-system]",
)
@agents_gone_timeout
@click.option("--dry-run", is_flag=True, help="Say what would be removed; change nothing.")
@click.option("--kubeconfig", help=f"kubeconfig file ({DEFAULT_WITH_FLAG}).")
@click.option("--context", help="kubeconfig context (default: its current context).")
@click.option("--in-cluster", is_flag=True, help="Use the pod's service account (the chart's hook).")
def cleanup(
    namespace: str | None,
    timeout: float,
    dry_run: bool,
    kubeconfig: str | None,
    context: str | None,
    in_cluster: bool,
) -> None:
    """Remove what topoalloc left outside its objects: delete its webhook configurations (no new
    scheduling gates) and agent DaemonSets, wait for the agent pods to go, then remove the agent's
    labels and extended resources from the Nodes, the ResourceSlices of the topoalloc.io driver and
    topoalloc's DeviceClasses, and release topoalloc's scheduling gates from pods.

    \b
    It says what it leaves on purpose: claims allocated from topoalloc's devices, Reservations
    holding room, running pods with devices topoalloc allocated.
    Exit status: 0 when everything went, 1 when something could not be removed (said on stderr).
    """
    from topoalloc.commands.installer.cleanup import cleanup as run
    from topoalloc.commands.installer.cluster import answered, open_cluster
    from topoalloc.commands.installer.manifests import NAMESPACE

    if namespace is None:
        namespace = NAMESPACE
        if in_cluster and POD_NAMESPACE.is_file():
            namespace = POD_NAMESPACE.read_text().strip() or NAMESPACE
    cluster = open_cluster(kubeconfig, context, in_cluster)
    result = answered(
        lambda: run(cluster, namespace=namespace, dry_run=dry_run, timeout=timeout), cluster.host
    )
    click.get_current_context().exit(print_cleanup(result))
