"""`topoalloc allocator`: run the scheduler-extender service."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import logging
import signal
from pathlib import Path
from typing import Any

import click

from allocator.runtime.config import ServiceConfig
from apis.documents import load_mapping
from apis.errors import InputError
from apis.topology_profile import PROFILE_NAMES
from topoalloc.commands.kube_access import DEFAULT_WITH_FLAG, config_error, require_kubeconfig
from topoalloc.errors import BadInput


def _weights(values: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in values:
        name, sep, weight = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            out[name.strip()] = float(weight)
        except ValueError:
            raise click.BadParameter(f"{item!r}: expected NAME=WEIGHT", param_hint="--weight") from None
        if (why := _unknown_component(name.strip())) is not None:
            raise click.BadParameter(why, param_hint="--weight")
    return out


def _unknown_component(name: str) -> str | None:
    """Why `name` is not a score component the allocator has (the core ignores a weight without a
    component, since the simulator plugs its own in; the allocator plugs none, so a typo would
    silently do nothing)."""
    from allocator.core.scoring.scorer import DEFAULT_WEIGHTS_BY_COMPONENT

    known = list(DEFAULT_WEIGHTS_BY_COMPONENT)
    if name in known:
        return None
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown score component {name!r}{hint}; known: {', '.join(known)}"


@click.command("allocator")
@click.option(
    "-c",
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="YAML/JSON settings file; flags given on the command line override it.",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, exists=True),
    help=f"kubeconfig file ({DEFAULT_WITH_FLAG}).",
)
@click.option("--context", help="kubeconfig context.")
@click.option("--in-cluster/--no-in-cluster", default=None, help="Use the pod's service account.")
@click.option("--api-server", "api_host", help="Plain API server URL without credentials (testing only).")
@click.option("--host", help="Extender listen address.  [default: 0.0.0.0]")
@click.option("--port", type=click.IntRange(0, 65535), help="Extender HTTPS port.  [default: 8443]")
@click.option("--health-host", help="Health/metrics listen address.  [default: 0.0.0.0]")
@click.option(
    "--health-port",
    type=click.IntRange(0, 65535),
    help="Plain-HTTP port of /healthz, /readyz, /metrics.  [default: 8080]",
)
@click.option("--tls-cert", type=click.Path(dir_okay=False), help="Server certificate (PEM).")
@click.option("--tls-key", type=click.Path(dir_okay=False), help="Server private key (PEM).")
@click.option(
    "--client-ca", type=click.Path(dir_okay=False), help="CA bundle that client certificates must chain to."
)
@click.option(
    "--tls-reload-interval", type=click.FloatRange(0.05), help="Seconds between certificate file checks."
)
@click.option(
    "--allow-client",
    "allowed_clients",
    multiple=True,
    help="Allowed client: CN or SAN value, or CN=…, O=…, DNS:…, URI:…, IP:… (repeatable). "
    "Default: any certificate the CA signed.",
)
@click.option(
    "--leader-elect/--no-leader-elect",
    "leader_enabled",
    default=None,
    help="Lease-based leader election (on by default).",
)
@click.option(
    "--lease-name",
    "leader_lease_name",
    help="Name of the leader-election Lease.  [default: topoalloc-allocator]",
)
@click.option("--lease-namespace", "leader_namespace", help="Namespace of the Lease (default: the pod's).")
@click.option("--identity", "leader_identity", help="Leader election identity (default: the pod name).")
@click.option(
    "--lease-duration",
    "leader_lease_duration",
    type=click.FloatRange(0, min_open=True),
    help="Seconds a lease holds before others may take it over.  [default: 15]",
)
@click.option(
    "--renew-deadline",
    "leader_renew_deadline",
    type=click.FloatRange(0, min_open=True),
    help="Seconds the leader keeps trying to renew before it steps down.  [default: 10]",
)
@click.option(
    "--retry-period",
    "leader_retry_period",
    type=click.FloatRange(0, min_open=True),
    help="Seconds between attempts to acquire or renew the lease.  [default: 2]",
)
@click.option(
    "--round-trips",
    type=click.IntRange(1, 2),
    help="Extender calls before bind: 1 filter picks the node (kube-scheduler without "
    "prioritizeVerb), 2 filter + prioritize (docs/service.md).  [default: 1]",
)
@click.option(
    "--bind-deadline",
    type=click.FloatRange(0, min_open=True),
    help="Abandon a bind not bound by then (keep below kube-scheduler's httpTimeout).",
)
@click.option(
    "--reservation-ttl",
    type=click.FloatRange(0, min_open=True),
    help="Seconds a reservation waits for its pod to show up bound.",
)
@click.option("--events/--no-events", default=None, help="Write pod Events on allocation failures.")
@click.option(
    "--scoring",
    "scoring_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="YAML file with the allocator core's ScoringConfig.",
)
@click.option(
    "--weight",
    "weights",
    multiple=True,
    metavar="NAME=W",
    help="Scorer weight, e.g. --weight topology=2 (repeatable; overrides --scoring).",
)
@click.option(
    "--gang/--no-gang",
    "gang_enabled",
    default=None,
    help="Gang scheduling: admission webhook, gang controller (on by default; docs/gang.md).",
)
@click.option(
    "--placement/--no-placement",
    "placement_enabled",
    default=None,
    help="Placement mode: every GPU pod placed at admission, whatever its scheduler (docs/placement.md); "
    "off where kube-scheduler calls the extender.",
)
@click.option("--webhook-host", "admission_host", help="Admission webhook listen address.")
@click.option(
    "--webhook-port",
    "admission_port",
    type=click.IntRange(0, 65535),
    help="Admission webhook HTTPS port.  [default: 9443]",
)
@click.option(
    "--topology-key",
    "topology_keys",
    multiple=True,
    help="Node label naming a topology domain, narrowest first (repeatable; replaces the defaults).",
)
@click.option(
    "--gang-plugin-schedulers",
    metavar="NAMES",
    help="Comma-separated schedulers that run kube-scheduler's GangScheduling plugin: Kubernetes' own "
    'gangs (scheduling.k8s.io) of their pods are steered, not gated; "" for none.  '
    "[default: default-scheduler]",
)
@click.option(
    "--topology-profile",
    "gang_topology_profile",
    type=click.Choice(PROFILE_NAMES),
    help="Topology levels from the nodes' labels (docs/topology.md).  [default: auto]",
)
@click.option("-v", "--verbose", count=True, help="-v info, -vv debug.")
def allocator(
    config_file: Path | None,
    scoring_file: Path | None,
    weights: tuple[str, ...],
    verbose: int,
    api_host: str | None,
    allowed_clients: tuple[str, ...],
    leader_enabled: bool | None,
    topology_keys: tuple[str, ...],
    gang_plugin_schedulers: str | None,
    **flags: Any,
) -> None:
    """Run the allocator: kube-scheduler's filter/prioritize/bind extender over mutual TLS."""
    logging.basicConfig(
        level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose + 1, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # cel-python logs every parse tree at DEBUG: never ours to read.
    logging.getLogger("celpy").setLevel(max(logging.INFO, logging.getLogger().level))
    try:
        cfg = ServiceConfig.load(config_file) if config_file else ServiceConfig()
        cfg = cfg.updated(**flags, leader_enabled=leader_enabled)
    except InputError:
        raise  # the file itself: `error: allocator config (<path>:<line>): ...`, exit 2
    except (ValueError, TypeError, OSError) as exc:
        raise click.UsageError(str(exc)) from None
    if allowed_clients:
        cfg.allowed_clients = list(allowed_clients)
    if topology_keys:
        cfg.gang.topology_keys = list(topology_keys)
    if gang_plugin_schedulers is not None:
        cfg.gang.gang_plugin_schedulers = [n.strip() for n in gang_plugin_schedulers.split(",") if n.strip()]
    scoring = dict(cfg.scoring)
    if scoring_file:
        scoring.update(load_mapping(scoring_file, "scoring file"))  # InputError: exit 2
    if weights:
        scoring.setdefault("weights", {}).update(_weights(weights))
    for name in (scoring.get("weights") or {}) if isinstance(scoring.get("weights"), dict) else ():
        if (why := _unknown_component(str(name))) is not None:
            raise click.UsageError(f"scoring: weights: {why}")
    cfg.scoring = scoring
    from allocator.runtime.coreadapter import CoreAdapter

    try:
        CoreAdapter.check_scoring(scoring)
    except (ValueError, TypeError, KeyError) as exc:
        raise click.UsageError(f"scoring: {exc}") from None
    from allocator.runtime.certs import CertError, check_serving_files

    try:  # before anything listens or connects: a bad file is the user's to fix, said in one line
        check_serving_files(cfg.tls_cert, cfg.tls_key, cfg.client_ca)
    except CertError as exc:
        raise BadInput(exc.what, exc.where, exc.why) from None
    if not api_host and not cfg.in_cluster:
        require_kubeconfig(cfg.kubeconfig)  # a missing file: `error: kubeconfig (<file>): not found`
    asyncio.run(serve(cfg, api_host=api_host))


async def serve(cfg: ServiceConfig, *, api_host: str | None = None) -> None:
    from kubernetes.aio.config import ConfigException

    from allocator.assembly import build_allocator
    from allocator.runtime.kube import KubeApi

    try:
        api = await KubeApi.connect(
            host=api_host,
            kubeconfig=cfg.kubeconfig,
            context=cfg.context,
            in_cluster=cfg.in_cluster,
            timeout=cfg.api_timeout,
        )
    except ConfigException as exc:
        raise config_error(cfg.kubeconfig, exc, in_cluster=bool(cfg.in_cluster)) from None
    service = build_allocator(cfg, api)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await service.start()
        await stop.wait()
        logging.getLogger(__name__).warning("shutting down")
    finally:
        await service.stop()
        await api.close()
