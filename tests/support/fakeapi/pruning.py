"""Pruning of custom resources by their CRD's structural schema, as kube-apiserver does on every
write: a field the schema does not declare is dropped silently (the write succeeds, the field is
gone on read). The fake serves the project's own CRDs (deploy/crds) this way, so a test that
writes a field the CRD lacks fails here as it would against a real cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .behaviour import KindBehaviour
from .objects import JsonObj

CRD_DIR = Path(__file__).resolve().parents[3] / "deploy" / "crds"
# Kept at the root whatever the schema says: ObjectMeta is pruned by its Go type, not the schema.
ROOT_KEPT = ("apiVersion", "kind", "metadata")


def crd_schema(plural: str, group: str, version: str) -> dict[str, Any] | None:
    """The openAPIV3Schema of `version` of the CRD `plural.group` in deploy/crds, if there is one."""
    path = CRD_DIR / f"{plural}.{group}.yaml"
    if not path.is_file():
        return None
    crd = yaml.safe_load(path.read_text())
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            return dict(served["schema"]["openAPIV3Schema"])
    return None


def prune(value: Any, schema: dict[str, Any]) -> Any:
    """`value` without what `schema` does not declare (a structural schema: objects have either
    `properties` or `additionalProperties`; `x-kubernetes-preserve-unknown-fields` keeps the rest)."""
    if isinstance(value, list):
        items = schema.get("items")
        return [prune(v, items) for v in value] if isinstance(items, dict) else value
    if not isinstance(value, dict):
        return value
    keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    if isinstance(properties, dict):
        return {
            k: prune(v, properties[k]) if k in properties else v
            for k, v in value.items()
            if k in properties or keep_unknown
        }
    if isinstance(extra, dict):
        return {k: prune(v, extra) for k, v in value.items()}
    if keep_unknown or extra is True:
        return value
    return {}  # an object schema that declares nothing keeps nothing


class PrunedCustomResource(KindBehaviour):
    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema

    def canonicalise(self, obj: JsonObj) -> None:
        properties = self.schema.get("properties") or {}
        for key in list(obj):
            if key in ROOT_KEPT:
                continue
            if key in properties:
                obj[key] = prune(obj[key], properties[key])
            elif not self.schema.get("x-kubernetes-preserve-unknown-fields"):
                del obj[key]
