"""`topoalloc agent`: run the node agent, or one pass printed (`--once --print`), on this machine or a
fixture. Its `record-fixture` subcommand lives in `topoalloc.commands.record_fixture`."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click
import yaml

from agent import host_paths
from agent.config import ConfigError, load_config
from apis.errors import InputError
from topoalloc.commands.kube_access import DEFAULT_IN_A_POD, config_error, in_a_pod, require_kubeconfig
from topoalloc.commands.record_fixture import record_fixture
from topoalloc.errors import BadInput
from topoalloc.output import dump

log = logging.getLogger("agent")


def _logging(verbose: int) -> None:
    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def node_patch_document(name: str, labels: dict[str, Any], extended: dict[str, Any]) -> dict[str, Any]:
    """The Node change the agent would make, as a merge-patch-shaped Node document."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {k: v for k, v in labels.items() if v is not None}},
        "status": {
            "capacity": {k: v for k, v in extended.items() if v is not None},
            "allocatable": {k: v for k, v in extended.items() if v is not None},
        },
    }


def _dump(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=1000)


@click.group(invoke_without_command=True)
@click.option(
    "--fixture",
    type=click.Path(exists=True, file_okay=False),
    help="Read a hardware fixture, not the machine.",
)
@click.option(
    "--node-name", envvar="NODE_NAME", help="Node to publish for (default: $NODE_NAME; the fixture's name)."
)
@click.option(
    "--config", "config_file", type=click.Path(exists=True, dir_okay=False), help="Agent config YAML."
)
@click.option(
    "--kubeconfig",
    type=click.Path(exists=True, dir_okay=False),
    help=f"kubeconfig file ({DEFAULT_IN_A_POD}).",
)
@click.option(
    "--sysfs-root",
    type=click.Path(exists=True, file_okay=False),
    default=host_paths.SYSFS,
    show_default=True,
    help="sysfs root when not using --fixture.",
)
@click.option("--resync", type=float, help="Seconds between resyncs (default 10, or the config's).")
@click.option("--once", is_flag=True, help="Run one pass and exit.")
@click.option(
    "--print", "print_only", is_flag=True, help="With --once: print the Device and Node patch, no cluster."
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(["yaml", "json"]),
    default="yaml",
    show_default=True,
    help="With --print: the Device and the Node patch as YAML documents, or as a JSON List.",
)
@click.option(
    "--mode",
    type=click.Choice(["device-plugin", "dra"]),
    help="The node's device path (default: the config's `mode`, else device-plugin): "
    "device-plugin (extended resources, kubelet device plugins) or dra (ResourceSlices, the DRA plugin).",
)
@click.option("--no-hotplug", is_flag=True, help="Do not listen for udev events.")
@click.option(
    "--health-port", type=int, help="Port of /healthz and /readyz (0: any free port; default 9823)."
)
@click.option(
    "--metrics-address",
    help="Address of the /metrics listener (default: the config's metrics.address, 0.0.0.0).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Port of /metrics on the metrics address (0: any free port; default: the config's "
    "metrics.port, 9824).",
)
@click.option(
    "--device-plugin/--no-device-plugin",
    default=None,
    help="Serve the kubelet device plugins (nvidia.com/gpu, koordinator.sh/gpu-core, koordinator.sh/gpu, "
    "koordinator.sh/rdma) "
    "and hand containers exactly the devices in their device-allocated annotation. Default: on, "
    "except with --fixture (no kubelet there unless a test brings one).",
)
@click.option(
    "--node-choice/--no-node-choice",
    default=True,
    show_default=True,
    help="A pod that reaches the node without an allocation for it (no device-allocated annotation, or "
    "one made for another node) gets devices the agent chooses by topology, written into its "
    "annotation; --no-node-choice refuses it at admission.",
)
@click.option(
    "--device-plugin-dir",
    default=host_paths.DEVICE_PLUGINS,
    show_default=True,
    help="kubelet's device plugin directory (kubelet.sock and the plugin sockets).",
)
@click.option(
    "--pod-resources-socket",
    default=host_paths.POD_RESOURCES_SOCKET,
    show_default=True,
    help="kubelet's PodResources API (which pod is being admitted; the cross-check).",
)
@click.option(
    "--cdi-root",
    "cdi_roots",
    multiple=True,
    help="Folder of CDI specs (repeatable; default /etc/cdi and /var/run/cdi).",
)
@click.option(
    "--dev-root",
    default=host_paths.DEV,
    show_default=True,
    help="Where the agent sees the host's /dev (device nodes handed to containers are checked here).",
)
@click.option(
    "--dra-plugin/--no-dra-plugin",
    default=None,
    help="In dra mode, serve kubelet's DRA plugin (prepare claims, write their CDI specs). Default: on, "
    "except with --fixture (no kubelet there unless a test brings one).",
)
@click.option(
    "--dra-registry-dir",
    default=host_paths.DRA_REGISTRY,
    show_default=True,
    help="kubelet's plugin registration folder (the DRA plugin's registration socket).",
)
@click.option(
    "--dra-plugin-dir",
    default=host_paths.DRA_PLUGIN,
    show_default=True,
    help="Folder of the DRA plugin's socket; kubelet dials this path, so it must be the host's.",
)
@click.option(
    "--dra-cdi-root",
    default=host_paths.CDI_DYNAMIC,
    show_default=True,
    help="Where the DRA plugin writes the CDI spec of each prepared claim.",
)
@click.option(
    "--state-dir",
    default=host_paths.STATE,
    show_default=True,
    help="Folder of the agent's checkpoints (served pods, mid-tier window, Xid history; prepared claims).",
)
@click.option(
    "--fixture-events",
    type=click.Path(file_okay=False),
    help="With --fixture: a folder whose event files (Xid, double-bit ECC) the replayed NVML delivers "
    "to the agent, to rehearse a GPU failure (see `topoalloc agent inject-event`).",
)
@click.option("-v", "--verbose", count=True, help="-v info, -vv debug logging on stderr.")
@click.pass_context
def agent(
    ctx: click.Context,
    fixture: str | None,
    node_name: str | None,
    config_file: str | None,
    kubeconfig: str | None,
    sysfs_root: str,
    resync: float | None,
    once: bool,
    print_only: bool,
    output: str,
    mode: str | None,
    no_hotplug: bool,
    health_port: int | None,
    metrics_address: str | None,
    metrics_port: int | None,
    device_plugin: bool | None,
    node_choice: bool,
    device_plugin_dir: str,
    pod_resources_socket: str,
    cdi_roots: tuple[str, ...],
    dev_root: str,
    dra_plugin: bool | None,
    dra_registry_dir: str,
    dra_plugin_dir: str,
    dra_cdi_root: str,
    state_dir: str,
    fixture_events: str | None,
    verbose: int,
) -> None:
    """Run the node agent: discover GPUs, NVLink, PCIe, NUMA, RDMA; publish the Device CR."""
    if ctx.invoked_subcommand is not None:
        return
    _logging(verbose)
    from agent.fixtures.loader import Fixture, FixtureError
    from agent.main_loop import Agent
    from agent.publish.device_builder import device_object

    try:
        cfg = load_config(config_file)
    except InputError as exc:
        raise BadInput(exc.what, exc.where, exc.why) from None
    except ConfigError as exc:
        raise BadInput("agent config", str(config_file), str(exc).removeprefix(f"{config_file}: ")) from None
    if resync is not None:
        cfg.resync_seconds = resync
    if health_port is not None:
        cfg.health_port = health_port
    if metrics_address is not None:
        cfg.metrics.address = metrics_address
    if metrics_port is not None:
        cfg.metrics.port = metrics_port
    if mode is not None:
        cfg.mode = mode
    dra_mode = cfg.mode == "dra"
    if dra_mode and device_plugin:
        raise click.UsageError("--device-plugin: a node in dra mode serves no device plugins")
    if not dra_mode and dra_plugin:
        raise click.UsageError(f"--dra-plugin: a node in {cfg.mode} mode serves no DRA plugin")
    if fixture_events is not None and fixture is None:
        raise click.UsageError("--fixture-events needs --fixture: only a replayed NVML takes events")
    if fixture is not None:
        try:
            fx = Fixture.load(fixture)
        except FixtureError as exc:
            raise BadInput("fixture", fixture, str(exc)) from None
        nvml: Any = fx.nvml
        root: Path = fx.sys_root
        node_name = node_name or Path(fixture).resolve().name
    else:
        import pynvml

        nvml, root = pynvml, Path(sysfs_root)
    if not node_name:
        raise click.UsageError("no node name: pass --node-name or set NODE_NAME")
    if print_only and not once:
        raise click.UsageError("--print needs --once")

    if print_only:
        runner = Agent(node_name=node_name, nvml=nvml, sysfs_root=root, config=cfg)
        result = runner.run_once()
        runner.shutdown()
        docs = [device_object(result.device), node_patch_document(node_name, result.labels, result.extended)]
        if result.pool:
            from agent.dra.slices import pool_slices

            docs += pool_slices(node_name, result.pool, 1)
        if output == "json":
            click.echo(dump({"apiVersion": "v1", "kind": "List", "items": docs}, "json"), nl=False)
        else:
            click.echo(_dump(docs), nl=False)
        return

    from kubernetes.config import ConfigException

    from agent.kube import Kube, api_client

    if not kubeconfig and not in_a_pod():
        require_kubeconfig(None)  # `error: kubeconfig (~/.kube/config): not found`, exit 2
    try:
        kube = Kube(api_client(kubeconfig))
    except ConfigException as exc:
        raise config_error(kubeconfig, exc, in_cluster=not kubeconfig) from None
    from agent.parts import NO_PLUGIN, KubeletPlugin

    plugins: KubeletPlugin = NO_PLUGIN
    draplugin: KubeletPlugin = NO_PLUGIN
    if device_plugin is None:
        device_plugin = fixture is None and not dra_mode
    if dra_plugin is None:
        dra_plugin = fixture is None and dra_mode
    if dra_plugin and not once:
        from agent.dra.service import DraService, DraSettings

        draplugin = DraService(
            DraSettings(
                registry_dir=dra_registry_dir,
                plugin_dir=dra_plugin_dir,
                cdi_root=dra_cdi_root,
                dev_root=dev_root,
                state_dir=state_dir,
            ),
            node_name=node_name,
            sysfs_root=root,
            kube=kube,
        )
    if device_plugin and not once:
        from agent.deviceplugin.cdi import DEFAULT_CDI_ROOTS
        from agent.deviceplugin.service import DevicePluginService, DevicePluginSettings

        settings = DevicePluginSettings(
            plugin_dir=device_plugin_dir,
            pod_resources_socket=pod_resources_socket,
            cdi_roots=cdi_roots or DEFAULT_CDI_ROOTS,
            dev_root=dev_root,
            state_dir=state_dir,
            choose_on_node=node_choice,
        )
        plugins = DevicePluginService(settings, node_name=node_name, sysfs_root=root, kube=kube)
    runner = Agent(
        node_name=node_name,
        nvml=nvml,
        sysfs_root=root,
        config=cfg,
        kube=kube,
        device_plugins=plugins,
        dra_plugin=draplugin,
    )
    if once:
        result = runner.run_once()
        runner.shutdown()
        for error in result.errors:
            click.echo(f"error: {error}", err=True)
        sys.exit(1 if result.errors else 0)

    from agent.healthz import METRICS_ONLY, HealthServer

    server = HealthServer(cfg.health_address, cfg.health_port, runner.health_state)
    server.start()
    servers = [server]
    if cfg.metrics.enabled:
        m = cfg.metrics
        metrics = HealthServer(m.address, m.port, runner.health_state, paths=METRICS_ONLY, name="metrics")
        metrics.start()
        servers.append(metrics)
        log.warning("agent for node %s; metrics on %s:%d", node_name, m.address, servers[-1].port)
    log.warning("agent for node %s; health on :%d", node_name, server.port)
    inbox = None
    if fixture_events is not None:
        from agent.fixtures.event_inbox import EventInbox

        inbox = EventInbox(fixture_events, nvml)
        inbox.start()
        log.warning("fixture NVML events are taken from %s", fixture_events)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        runner.run(stop, hotplug=not no_hotplug)
    finally:
        if inbox is not None:
            inbox.stop()
        for each in servers:
            each.stop()


@click.command("inject-event")
@click.argument("inbox", type=click.Path(file_okay=False))
@click.option("--gpu", required=True, help="NVML index (as `nvidia-smi -i`) or UUID of the GPU.")
@click.option("--xid", type=click.IntRange(min=0), help="An Xid error with this number.")
@click.option("--ecc", type=click.Choice(["double-bit"]), help="A double-bit ECC error.")
def inject_event(inbox: str, gpu: str, xid: int | None, ecc: str | None) -> None:
    """Hand an NVML event to an agent running with `--fixture ... --fixture-events INBOX`."""
    if (xid is None) == (ecc is None):
        raise click.UsageError("give exactly one of --xid and --ecc")
    from agent.fixtures.event_inbox import write_event

    event: dict[str, Any] = {"gpu": int(gpu) if gpu.isdigit() else gpu}
    event.update({"xid": xid} if xid is not None else {"ecc": ecc})
    name = f"event-{time.time_ns()}"
    path = write_event(inbox, name, [event])
    click.echo(f"{path}: {event} (renamed .done once the agent took it)")


agent.add_command(record_fixture)
agent.add_command(inject_event)
