"""`topoalloc version`: the versions that ship together, as this installation of the package has
them: the Python package, the Helm chart it carries (charts/topoalloc/Chart.yaml) and the
topoalloc image the kustomize bases deploy (their `images:` tag, what `make image` builds)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import click
import yaml

from topoalloc.output import dump, output_option

CHART = Path("charts") / "topoalloc" / "Chart.yaml"
IMAGE = "topoalloc"


def versions(root: Path) -> dict[str, Any]:
    """{"package", "chart": {"version", "appVersion"}, "image", "manifests"}; a part the manifests
    folder lacks is None."""
    from topoalloc.commands.installer.kustomize import build, image_name
    from topoalloc.commands.installer.manifests import missing_bases

    chart: dict[str, str] | None = None
    if (root / CHART).is_file():
        meta = yaml.safe_load((root / CHART).read_text()) or {}
        chart = {"version": str(meta.get("version", "")), "appVersion": str(meta.get("appVersion", ""))}
    images: set[str] = set()
    if not missing_bases(root):
        for base in (root / "deploy", root / "daemonset"):
            images |= {i for i in _images(build(base)) if image_name(i) == IMAGE}
    return {
        "package": importlib.metadata.version("topoalloc"),
        "chart": chart,
        "image": ", ".join(sorted(images)) or None,
        "manifests": str(root),
    }


def _images(node: Any) -> set[str]:
    """Every container image named anywhere in the documents."""
    if isinstance(node, dict):
        found = {str(node["image"])} if isinstance(node.get("image"), str) and "name" in node else set()
        for value in node.values():
            found |= _images(value)
        return found
    if isinstance(node, list):
        return set().union(*(_images(item) for item in node)) if node else set()
    return set()


@click.command("version")
@output_option("text", "the versions")
@click.option(
    "--manifests",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder holding deploy/, daemonset/ and charts/.  [default: the package's own, or this checkout's]",
)
def version(output: str, manifests: Path | None) -> None:
    """Print the package's, the Helm chart's and the image's versions (they ship together)."""
    from topoalloc.commands.installer.manifests import repo_root

    found = versions(manifests or repo_root())
    if output != "text":
        click.echo(dump(found, output), nl=False)
        return
    chart = found["chart"]
    click.echo(f"package:   topoalloc {found['package']}")
    click.echo(
        f"chart:     topoalloc {chart['version']} (appVersion {chart['appVersion']})"
        if chart
        else f"chart:     none ({CHART} not in {found['manifests']})"
    )
    click.echo(f"image:     {found['image'] or 'none (no kustomize bases there)'}")
    click.echo(f"manifests: {found['manifests']}")
