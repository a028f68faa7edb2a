"""CDI (Container Device Interface) specs on the host: which GPUs have a CDI device name.

`nvidia-ctk cdi generate` writes a spec of `kind: nvidia.com/gpu` to /etc/cdi or /var/run/cdi with
one device per GPU, named by index and/or UUID (`--device-name-strategy`), each carrying the
`/dev/nvidiaN` node in its container edits. A GPU's CDI name is the device named by its UUID, else
the device whose edits hold its `/dev/nvidia<minor>`. The specs are re-read when a file changes.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import yaml

from agent import host_paths

log = logging.getLogger(__name__)

DEFAULT_CDI_ROOTS = (host_paths.CDI_STATIC, host_paths.CDI_DYNAMIC)
GPU_KIND = "nvidia.com/gpu"


class CdiRegistry:
    def __init__(self, roots: tuple[str, ...] | list[str] = DEFAULT_CDI_ROOTS, kind: str = GPU_KIND) -> None:
        self.roots = [Path(r) for r in roots]
        self.kind = kind
        self._lock = threading.Lock()
        self._stamp: tuple[tuple[str, int, int], ...] | None = None
        self._by_uuid: dict[str, str] = {}
        self._by_node: dict[str, str] = {}

    def _files(self) -> list[Path]:
        out: list[Path] = []
        for root in self.roots:
            if root.is_dir():
                out.extend(p for p in sorted(root.iterdir()) if p.suffix in (".yaml", ".yml", ".json"))
        return out

    def _refresh(self) -> None:
        files = self._files()
        stamp = []
        for path in files:
            try:
                st = path.stat()
            except OSError:
                continue
            stamp.append((str(path), st.st_mtime_ns, st.st_size))
        if tuple(stamp) == self._stamp:
            return
        by_uuid: dict[str, str] = {}
        by_node: dict[str, str] = {}
        for path in files:
            spec = _load(path)
            if spec is None or spec.get("kind") != self.kind:
                continue
            for dev in spec.get("devices") or []:
                if not isinstance(dev, dict) or not isinstance(dev.get("name"), str):
                    continue
                name = f"{self.kind}={dev['name']}"
                if dev["name"].startswith("GPU-"):
                    by_uuid.setdefault(dev["name"], name)
                edits = dev.get("containerEdits") or {}
                nodes = [n.get("path") for n in edits.get("deviceNodes") or [] if isinstance(n, dict)]
                if len(nodes) == 1 and isinstance(nodes[0], str):  # one GPU's node, not "all"
                    by_node.setdefault(nodes[0], name)
        self._stamp, self._by_uuid, self._by_node = tuple(stamp), by_uuid, by_node

    def gpu_names(self, gpus: list[tuple[int, str]]) -> list[str] | None:
        """CDI names for (minor, uuid) GPUs, in order; None unless every one of them has a name."""
        with self._lock:
            self._refresh()
            names = []
            for minor, uuid in gpus:
                name = self._by_uuid.get(uuid) or self._by_node.get(f"/dev/nvidia{minor}")
                if name is None:
                    return None
                names.append(name)
            return names


def _load(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        log.warning("CDI spec %s unreadable, ignored: %s", path, exc)
        return None
    return data if isinstance(data, dict) else None
