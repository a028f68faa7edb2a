"""`topoalloc doctor`: read the cluster once, run every check, print the findings; exit 0 when none
fails (warnings allowed), 1 when one does, 2 for bad input (flags, kubeconfig)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from apis.timestamps import parse_duration
from topoalloc.commands.kube_access import DEFAULT_WITH_FLAG
from topoalloc.errors import BadInput
from topoalloc.output import dump, output_option

EXCLUDED_NAMESPACES = ("kube-system", "topoalloc-system")


class Duration(click.ParamType):
    """A duration: seconds, or Go's form (90s, 5m, 1h30m)."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            return float(value)
        seconds = parse_duration(str(value))
        if seconds is None:
            self.fail(f"{value!r} is not a duration (seconds, or 90s, 5m, 1h30m)", param, ctx)
        return seconds


def doctor_options(func: Any) -> Any:
    """The thresholds and probe flags, shared with `install --wait` and `upgrade --wait`."""
    for option in reversed(
        [
            click.option(
                "--stale-after",
                type=Duration(),
                help="A Device not refreshed for this long is stale.  [default: twice the agents' "
                "statusRefreshSeconds plus a resync: 10m10s with the installed defaults]",
            ),
            click.option(
                "--gated-after",
                type=Duration(),
                default="5m",
                show_default=True,
                help="Name pods gated by topoalloc (or GPU pods not bound) for longer than this.",
            ),
            click.option(
                "--prepare-after",
                type=Duration(),
                default="5m",
                show_default=True,
                help="Name bound pods whose claims topoalloc allocated that have not started after this.",
            ),
            click.option(
                "--probe-namespace",
                default="default",
                show_default=True,
                help="Where the webhooks are probed by a server-side dry-run pod create (nothing is stored).",
            ),
            click.option(
                "--no-probe", is_flag=True, help="Do not probe the webhooks (needs no create right)."
            ),
            click.option(
                "--scheduler-config",
                type=click.Path(exists=True, dir_okay=False, path_type=Path),
                help="A KubeSchedulerConfiguration to check against the cluster: the file copied to the "
                "control-plane nodes.  [default in kubeadm mode: the one install wrote to --kubeadm-dir]",
            ),
            click.option(
                "--kubeadm-dir",
                type=click.Path(file_okay=False, path_type=Path),
                default=Path("topoalloc-kubeadm"),
                show_default=True,
                help="Where `install --mode kubeadm` wrote kube-scheduler's files.",
            ),
        ]
    ):
        func = option(func)
    return func


def thresholds(flags: dict[str, Any]) -> Any:
    from topoalloc.commands.doctor.findings import Thresholds

    return Thresholds(
        stale_after=flags.get("stale_after"),
        gated_after=flags.get("gated_after") or 300.0,
        prepare_after=flags.get("prepare_after") or 300.0,
    )


def probe_namespace(flags: dict[str, Any]) -> str | None:
    if flags.get("no_probe"):
        return None
    namespace = flags.get("probe_namespace") or "default"
    if namespace in EXCLUDED_NAMESPACES:
        raise BadInput(
            "--probe-namespace", namespace, "the webhooks never see pods there: name another namespace"
        )
    return namespace


def diagnose(cluster: Any, root: Path | None, flags: dict[str, Any]) -> tuple[Any, list[Any]]:
    """(facts, findings) of one look at the cluster."""
    from topoalloc.commands.doctor.fetch import gather
    from topoalloc.commands.doctor.report import run_checks

    limits = thresholds(flags)
    facts = gather(
        cluster,
        root,
        limits,
        probe_namespace=probe_namespace(flags),
        scheduler_config=flags.get("scheduler_config"),
        kubeadm_dir=flags.get("kubeadm_dir"),
    )
    return facts, run_checks(facts, limits)


@click.command("doctor")
@doctor_options
@output_option("text", "the findings")
@click.option("-v", "--verbose", is_flag=True, help="Also the details of the checks that pass.")
@click.option("--kubeconfig", help=f"kubeconfig file ({DEFAULT_WITH_FLAG}).")
@click.option("--context", help="kubeconfig context (default: its current context).")
@click.option("--in-cluster", is_flag=True, help="Use the pod's service account.")
@click.option(
    "--manifests",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder holding deploy/ (the CRDs compared with the cluster's).  "
    "[default: the package's own, or this checkout's]",
)
def doctor(output: str, verbose: bool, manifests: Path | None, **flags: Any) -> None:
    """Check an installation end to end and say what is wrong, with the fix: CRDs, the allocator and
    its leader, the webhooks, the agents and their Devices, device plugins, the scheduler wiring of
    the install mode, pods that wait too long, claims never prepared, clocks. Read-only.

    \b
    Exit status: 0 when no check fails (warnings allowed), 1 when one fails, 2 for bad input.
    """
    from topoalloc.commands.doctor.findings import Summary
    from topoalloc.commands.doctor.report import as_data, render
    from topoalloc.commands.installer.cluster import answered, open_cluster
    from topoalloc.commands.installer.manifests import missing_bases, repo_root

    root = manifests or repo_root()
    if manifests is not None and missing_bases(root):
        raise BadInput("--manifests", str(manifests), "no deploy/ kustomize base here")
    probe_namespace(flags)  # bad input before any request
    cluster = open_cluster(flags.pop("kubeconfig"), flags.pop("context"), flags.pop("in_cluster"))
    facts, findings = answered(lambda: diagnose(cluster, root, flags), cluster.host)
    if output == "text":
        click.echo(render(facts, findings, verbose=verbose), nl=False)
    else:
        click.echo(dump(as_data(facts, findings), output), nl=False)
    click.get_current_context().exit(Summary.of(findings).exit_status)
