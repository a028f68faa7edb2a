"""`topoalloc inspect`: a Device CR, from a file or the cluster, as the `nvidia-smi topo -m` matrix."""

from __future__ import annotations

from typing import Any

import click

from apis.documents import load_documents
from apis.errors import InputError
from topoalloc.commands.kube_access import DEFAULT_IN_A_POD, config_error, in_a_pod, require_kubeconfig
from topoalloc.errors import BadInput, Failure
from topoalloc.output import dump, output_option


@click.command()
@click.argument("device_file", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--node", help="Read the Device of this node from the cluster.")
@output_option("matrix", "the connectivity matrix")
@click.option(
    "--kubeconfig",
    type=click.Path(exists=True, dir_okay=False),
    help=f"kubeconfig file for --node ({DEFAULT_IN_A_POD}).",
)
def inspect(device_file: str | None, node: str | None, output: str, kubeconfig: str | None) -> None:
    """Print a Device CR as the `nvidia-smi topo -m` matrix (GPU x GPU, GPU x NIC) with NUMA."""
    from agent.fixtures.topo_matrix import matrix_data, render
    from apis.device import Device

    if (device_file is None) == (node is None):
        raise click.UsageError("give a DEVICE.yaml or --node NAME")
    if device_file is not None:
        try:
            docs = [d for d in load_documents(device_file, "device file") if isinstance(d, dict)]
        except InputError as exc:
            raise BadInput(exc.what, exc.where, exc.why) from None
        raw = _device_document(docs, device_file)
    else:
        from kubernetes.config import ConfigException

        from agent.kube import TRANSPORT_ERRORS, Kube, api_client, short_error

        if not kubeconfig and not in_a_pod():
            require_kubeconfig(None)
        try:
            client = api_client(kubeconfig)
        except ConfigException as exc:
            raise config_error(kubeconfig, exc, in_cluster=not kubeconfig) from None
        raw = _device_of_node(Kube(client), node or "", TRANSPORT_ERRORS, short_error)
    try:
        device = Device.from_dict(raw)
    except ValueError as exc:
        raise BadInput("Device", device_file or node or "", f"not a valid Device: {exc}") from None
    if output == "matrix":
        click.echo(render(device), nl=False)
    else:
        click.echo(dump(matrix_data(device), output), nl=False)


def _device_of_node(kube: Any, node: str, transport_errors: Any, short_error: Any) -> dict:
    """The node's Device from the cluster. A 404 says which is missing: the Node (a name the
    cluster does not have: bad input) or only its Device (no agent has published one there)."""
    try:
        return dict(kube.get_device(node))
    except transport_errors as exc:
        if getattr(exc, "status", None) != 404:
            raise Failure("Device", node, short_error(exc)) from None
    try:
        kube.get_node(node)
    except transport_errors as exc:
        if getattr(exc, "status", None) == 404:
            raise BadInput(
                "--node", node, "no Node of that name in the cluster (kubectl get nodes)"
            ) from None
        raise Failure("Node", node, short_error(exc)) from None
    raise Failure(
        "Device",
        node,
        "the Node exists but has no Device: no topoalloc agent has published one for it (is the agent "
        "running there? kubectl get pods -A -o wide --field-selector spec.nodeName=" + node + ")",
    )


def _device_document(docs: list[dict], path: str) -> dict:
    """The Device CR of the file: a document of kind Device, or one without a kind that has the
    Device's `spec` (as `allocate --device` takes it). Anything else (a Node, a Pod, a fixture's
    machine.yaml) is not one: reading it as an empty Device would print "no GPUs" and succeed."""
    devices = [d for d in docs if d.get("kind") == "Device"]
    if not devices:
        devices = [d for d in docs if "kind" not in d and isinstance(d.get("spec"), dict)]
    if devices:
        return devices[0]
    kinds = sorted({str(d["kind"]) for d in docs if d.get("kind")})
    what = f"holds {' and '.join(kinds)}, not a Device CR" if kinds else "holds no Device CR"
    hint = " (kind: Device, or a document with its spec.devices)"
    raise BadInput("device file", path, what + hint)
