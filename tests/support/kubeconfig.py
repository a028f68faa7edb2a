"""A kubeconfig naming one server with a static token, for commands run against the fake API
server (which accepts any token)."""

from __future__ import annotations

from pathlib import Path

import yaml


def token_kubeconfig(folder: Path, server: str) -> Path:
    path = folder / "kubeconfig"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(config))
    return path
