"""All-in-one manifests of a release for `kubectl apply -f` (`make release-yaml` -> dist/).

The installer's own rendering (manifests.render), without anything cluster-specific: no TLS
Secrets (`topoalloc certs --secrets-yaml` makes them, or the cert-manager file has cert-manager
issue them), no install record, no DeviceClasses (resource.k8s.io/v1 needs Kubernetes 1.34:
`kubectl apply -k deploy/dra`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from topoalloc.commands.installer.kustomize import dump
from topoalloc.commands.installer.manifests import RECORD, ClusterFacts, InstallOptions, render, repo_root

VARIANTS = {
    "": ("generate", "then: topoalloc certs --secrets-yaml | kubectl apply -f -"),
    "-cert-manager": ("cert-manager", "cert-manager v1 issues the certificates"),
}


def release_files(version: str, root: Path | None = None) -> dict[str, str]:
    """File name -> content, one per variant."""
    out = {}
    for suffix, (certs, note) in VARIANTS.items():
        options = InstallOptions(version=version, certs=certs, device_classes=False)
        docs = [d for d in render(options, ClusterFacts(), root) if d["metadata"].get("name") != RECORD]
        head = (
            f"# topoalloc {version}, placement mode: kubectl apply --server-side -f this file; {note}.\n"
            "# Other modes, settings and agent pools: the Helm chart or `topoalloc install`.\n"
        )
        out[f"topoalloc-{version}{suffix}.yaml"] = head + dump(docs)
    return out


def main(argv: list[str]) -> None:
    import importlib.metadata

    target = Path(argv[0]) if argv else Path("dist")
    target.mkdir(parents=True, exist_ok=True)
    root = repo_root()
    for name, text in release_files(importlib.metadata.version("topoalloc"), root).items():
        (target / name).write_text(text)
        print(f"wrote {target / name}")


if __name__ == "__main__":
    main(sys.argv[1:])
