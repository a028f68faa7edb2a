"""Settings changed outside topoalloc, found before anything is applied.

A user who edits an installed object by hand (`kubectl edit` or `kubectl replace` of the agent's
ConfigMap to set `mode: dra`, say) owns the fields they changed. Server-side apply of the
installer's objects would then stop at that object with HTTP 409, after the objects before it
were applied (a half-done upgrade), and `--force-conflicts` would silently put the old value
back. So before applying, every object that already exists is applied as a dry run (`dryRun=All`,
no force): the API server itself says which fields another manager set differently. `deploy()`
refuses the whole run before changing anything when there are any, naming the object, the fields,
the managers and, for a configuration file held in a ConfigMap, the settings that differ, with how
to keep them (as values of the installation) or to drop them (`--force-conflicts`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from topoalloc.commands.installer.cluster import ApiError, Cluster
from topoalloc.commands.installer.kustomize import Doc

# The API server's words: `Apply failed with 1 conflict: conflict with "kubectl-replace" using v1:
# .data.agent.yaml`, or for several `Apply failed with 2 conflicts: conflicts with "kubectl-edit"
# using apps/v1:\n- .spec.replicas\n- ...` (one such block per manager).
_MANAGER = re.compile(r'conflicts? with "([^"]+)"[^:\n]*:')


@dataclass(frozen=True)
class Conflict:
    """Fields of one installed object that another field manager set to other values."""

    kind: str
    name: str  # namespace/name, or name
    fields: tuple[tuple[str, str], ...]  # (field path, manager)
    settings: tuple[str, ...] = ()  # `agent.yaml: mode is dra in the cluster, device-plugin in ...`

    def describe(self) -> str:
        managers = sorted({m for _, m in self.fields})
        paths = ", ".join(p for p, _ in self.fields)
        text = f"{self.kind} {self.name}: {paths} changed by {', '.join(managers)}"
        return text + (f" ({'; '.join(self.settings)})" if self.settings else "")


def find(cluster: Cluster, docs: list[Doc]) -> list[Conflict]:
    """The conflicts applying `docs` would meet, asked of the API server without changing anything."""
    found = []
    for doc in docs:
        if cluster.resource(str(doc["apiVersion"]), str(doc["kind"])) is None:
            continue  # a kind its CRD has not been applied for yet: nothing of it exists
        live = cluster.get(cluster.doc_path(doc))
        if live is None:
            continue
        try:
            cluster.apply(doc, dry_run=True)
        except ApiError as exc:
            if exc.status != 409:
                raise
            found.append(conflict(doc, live, exc.message))
    return found


def conflict(doc: Doc, live: Doc, message: str) -> Conflict:
    """One object's conflict from the API server's 409 message and the two versions of it."""
    meta = doc.get("metadata") or {}
    name = f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else str(meta["name"])
    fields = tuple(_fields(message)) or (("?", message),)
    settings: list[str] = []
    for path, _ in fields:
        if doc.get("kind") == "ConfigMap" and path.startswith(".data."):
            key = path[len(".data.") :]
            mine, theirs = (doc.get("data") or {}).get(key), (live.get("data") or {}).get(key)
            settings += [f"{key}: {line}" for line in differences(mine, theirs)]
    return Conflict(str(doc.get("kind")), name, fields, tuple(settings))


def _fields(message: str) -> list[tuple[str, str]]:
    """(field path, manager) of each conflict the message lists."""
    out = []
    blocks = list(_MANAGER.finditer(message))
    for i, block in enumerate(blocks):
        text = message[block.end() : blocks[i + 1].start() if i + 1 < len(blocks) else None]
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        paths = [line[1:].strip() for line in lines if line.startswith("-")] or lines[:1]
        out += [(path, block[1]) for path in paths]
    return out


def differences(ours: str | None, theirs: str | None) -> list[str]:
    """The settings two versions of a YAML configuration file disagree on, by dotted key:
    `mode is dra in the cluster, device-plugin in the installation`."""
    try:
        mine, live = yaml.safe_load(ours or "") or {}, yaml.safe_load(theirs or "") or {}
    except yaml.YAMLError:
        return ["not YAML"]
    if not isinstance(mine, Mapping) or not isinstance(live, Mapping):
        return [] if mine == live else ["changed"]
    out: list[str] = []
    _diff(mine, live, "", out)
    return out


def _diff(mine: Mapping[str, Any], live: Mapping[str, Any], prefix: str, out: list[str]) -> None:
    for key in sorted(set(mine) | set(live), key=str):
        path = f"{prefix}{key}"
        a, b = mine.get(key), live.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            _diff(a, b, f"{path}.", out)
        elif key not in live:
            out.append(f"{path} removed in the cluster ({_show(a)} in the installation)")
        elif key not in mine:
            out.append(f"{path} is {_show(b)} in the cluster, not in the installation")
        elif a != b:
            out.append(f"{path} is {_show(b)} in the cluster, {_show(a)} in the installation")


def _show(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()


def refusal(conflicts: list[Conflict]) -> str:
    """Why the run stopped before applying anything, and the two ways on."""
    lines = "; ".join(c.describe() for c in conflicts)
    return (
        f"settings changed outside topoalloc, nothing applied: {lines}. To keep them, give them to the "
        "installation (--set KEY=VALUE or --values FILE) so that every upgrade keeps them; to drop them "
        "and take the fields back, rerun with --force-conflicts"
    )
