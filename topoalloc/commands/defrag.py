"""`topoalloc defrag`: how fragmented a cluster's GPUs are, and the plan the migration controller
would make now (docs/defragmentation.md). Read-only: it lists Nodes, Device CRs, Pods,
Reservations and PodDisruptionBudgets once (and GETs the owners of the pods it would move, for their
maxUnavailable) and writes nothing.

It builds the allocator's own watch cache and core from those lists and runs the controller's
pass (allocator/defrag/planning.py) and lifecycle step (core/defrag/migration.py) on them, so what
it prints is what the leader would plan with the same settings (`--config`: the allocator's
config file, its `defrag:` block; flags override it).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import click

from topoalloc.commands.defrag_view import Snapshot, as_data, render
from topoalloc.commands.kube_access import DEFAULT_IN_A_POD, config_error, in_a_pod, require_kubeconfig
from topoalloc.errors import BadInput, Failure
from topoalloc.output import dump, output_option

JSON = dict[str, Any]


def _settings(config_file: str | None, overrides: dict[str, Any]) -> Any:
    import dataclasses

    from allocator.runtime.config import ServiceConfig
    from allocator.runtime.defrag_settings import DefragSettings
    from apis.errors import InputError

    settings = DefragSettings()
    if config_file:
        try:
            settings = ServiceConfig.load(config_file).defrag
        except (InputError, ValueError) as exc:
            raise BadInput("allocator config", config_file, str(exc)) from None
    return dataclasses.replace(settings, **{k: v for k, v in overrides.items() if v is not None})


def _api_failure(where: str, exc: Any) -> Failure:
    """The cluster's answer as a runtime failure, said as a user reads it."""
    if exc.status == 0:
        return Failure("cluster", where, f"unreachable: {exc.message or exc}")
    if exc.status in (401, 403):
        what = "unauthorized" if exc.status == 401 else "forbidden"
        return Failure("cluster", where, f"{what}: {exc.message or exc.reason}")
    return Failure("cluster", where, str(exc))


async def snapshot(api: Any, settings: Any, now: float) -> Snapshot:
    """Everything the command prints, read through `api` (an allocator.runtime.kube.KubeApi)."""
    from allocator.core.gang.plan import GangPlanSettings
    from allocator.defrag import planning
    from allocator.defrag.workloads import Owners
    from allocator.runtime.cache.store import ClusterCache
    from allocator.runtime.coreadapter import CoreAdapter
    from allocator.runtime.kube import DEVICES, NODES, PDBS, PODS, RESERVATIONS, ApiError

    core = CoreAdapter()
    cache = ClusterCache(core, outlines=True)
    for kind in (NODES, DEVICES, PODS, RESERVATIONS, PDBS):
        try:
            items, _ = await api.list(kind)
        except ApiError as exc:
            if exc.status == 404 and kind.custom:  # its CRD is not installed: there are none
                items = []
            else:
                raise
        cache.replace(kind, items)
    rooms = _hold_rooms(cache, core)
    got = await planning.plan_pass(cache, core, settings, GangPlanSettings(), now, Owners(api))
    return Snapshot(core.cluster.nodes, got, planning.limits_of(settings), settings, now, rooms)


def _hold_rooms(cache: Any, core: Any) -> int:
    """Available Reservations' rooms count as taken (whole: the command does not follow which
    owners took part of one); returns how many."""
    from apis import keys
    from apis.annotations import DeviceAllocations
    from apis.errors import CodecError
    from apis.reservation import Reservation

    held = 0
    for name, raw in cache.reservations.items():
        status = raw.get("status") or {}
        note = ((raw.get("metadata") or {}).get("annotations") or {}).get(keys.DEVICE_ALLOCATED)
        if status.get("phase") != "Available" or not status.get("nodeName") or not note:
            continue
        try:
            allocations = DeviceAllocations.from_json(note)
            req = core.request(Reservation.from_dict(raw).template_pod())
        except (CodecError, ValueError):
            continue
        cache.ledger.hold_room(f"reservation:{name}", status["nodeName"], allocations, req)
        held += 1
    return held


async def _run(kubeconfig: str | None, context: str | None, in_cluster: bool, settings: Any) -> Snapshot:
    import yaml
    from kubernetes.aio.config import ConfigException

    from allocator.runtime.kube import ApiError, KubeApi

    where = kubeconfig or ("in-cluster" if in_cluster else "kubeconfig")
    try:
        api = await KubeApi.connect(kubeconfig=kubeconfig, context=context, in_cluster=in_cluster)
    except ConfigException as exc:
        raise config_error(kubeconfig, exc, in_cluster=in_cluster) from None
    except yaml.YAMLError as exc:  # a file that is not YAML: bad input, said in one line
        raise BadInput("kubeconfig", kubeconfig or "", " ".join(str(exc).split())) from None
    try:
        return await snapshot(api, settings, time.time())
    except ApiError as exc:
        raise _api_failure(api.host or where, exc) from None
    finally:
        await api.close()


@click.command("defrag")
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    help=f"kubeconfig file of the cluster to read ({DEFAULT_IN_A_POD}).",
)
@click.option("--context", help="kubeconfig context.")
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False),
    help="The allocator's config file: plan with its `defrag:` settings.",
)
@click.option(
    "--min-wait", type=click.FloatRange(min=0), help="Plan for work pending at least this many seconds."
)
@click.option(
    "--allow-bare-pods/--no-allow-bare-pods", default=None, help="Pods no controller recreates may move."
)
@click.option(
    "--proactive/--no-proactive", default=None, help="With nothing unblocked, raise the largest block."
)
@click.option(
    "--explain", is_flag=True, help="Why each pod may or may not move, what each move unblocks, its cost."
)
@output_option("text", "the fragmentation and the plan")
def defrag(
    kubeconfig: str | None,
    context: str | None,
    config_file: str | None,
    min_wait: float | None,
    allow_bare_pods: bool | None,
    proactive: bool | None,
    explain: bool,
    output: str,
) -> None:
    """Show how fragmented the cluster's GPUs are and the moves defragmentation would make (read-only)."""
    settings = _settings(
        config_file, {"min_wait": min_wait, "allow_bare_pods": allow_bare_pods, "proactive": proactive}
    )
    in_cluster = not kubeconfig and in_a_pod()
    if not in_cluster:
        kubeconfig = require_kubeconfig(kubeconfig)
    snap = asyncio.run(_run(kubeconfig, context, in_cluster, settings))
    if output == "text":
        click.echo(render(snap, explain=explain), nl=False)
    else:
        click.echo(dump(as_data(snap, explain_too=explain), output), nl=False)
