"""`topoalloc inspect`: a Device CR, from a file or the cluster, as the `nvidia-smi topo -m` matrix."""

from __future__ import annotations

from pathlib import Path

import click
import yaml


@click.command()
@click.argument("device_file", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--node", help="Read the Device of this node from the cluster.")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False))
def inspect(device_file: str | None, node: str | None, kubeconfig: str | None) -> None:
    """Print a Device CR as the `nvidia-smi topo -m` matrix (GPU x GPU, GPU x NIC) with NUMA."""
    from agent.fixtures.topo_matrix import render
    from apis.device import Device

    if (device_file is None) == (node is None):
        raise click.UsageError("give a DEVICE.yaml or --node NAME")
    if device_file is not None:
        docs = [d for d in yaml.safe_load_all(Path(device_file).read_text()) if isinstance(d, dict)]
        devices = [d for d in docs if d.get("kind") == "Device"] or docs[:1]
        if not devices:
            raise click.ClickException(f"{device_file}: no Device document")
        raw = devices[0]
    else:
        from agent.kube import TRANSPORT_ERRORS, Kube, api_client, short_error

        try:
            raw = Kube(api_client(kubeconfig)).get_device(node)
        except TRANSPORT_ERRORS as exc:
            raise click.ClickException(f"Device {node}: {short_error(exc)}") from None
    try:
        device = Device.from_dict(raw)
    except ValueError as exc:
        raise click.ClickException(f"not a valid Device: {exc}") from None
    click.echo(render(device), nl=False)
