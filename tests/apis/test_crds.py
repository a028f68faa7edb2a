"""The CRDs are valid structural schemas, and Device objects of both dialects validate against ours."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given, settings

from apis.device import Device
from apis.podgroup import PodGroup
from tests.apis import strategies as s
from tests.apis.paths import PROTOCOL_DOC, REPO, require_shared

CRD_DIR = REPO / "deploy" / "crds"
JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
FORBIDDEN_IN_JUNCTORS = ("description", "type", "default", "additionalProperties", "nullable")


def _crds() -> dict[str, dict]:
    out = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc.get("kind") == "CustomResourceDefinition":
            out[doc["spec"]["names"]["kind"]] = doc
    return out


def structural_errors(
    node: dict, path: str = "", *, in_junctor: bool = False, root: bool = True
) -> list[str]:
    """Kubernetes' structural-schema rules (apiextensions.k8s.io/v1)."""
    errors: list[str] = []
    if in_junctor:
        for key in FORBIDDEN_IN_JUNCTORS:
            # The one exception: the int-or-string pattern `anyOf: [{type: integer}, {type: string}]`.
            if key in node and not (
                key == "type" and node[key] in ("integer", "string") and "properties" not in node
            ):
                errors.append(f"{path}: {key} not allowed inside a junctor")
    else:
        special = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        if not special and not node.get("type"):
            errors.append(f"{path}: missing type")
        if node.get("x-kubernetes-int-or-string") and "type" in node:
            errors.append(f"{path}: x-kubernetes-int-or-string must not have a type")
    if "properties" in node and "additionalProperties" in node:
        errors.append(f"{path}: properties and additionalProperties are mutually exclusive")
    for name, child in (node.get("properties") or {}).items():
        if root and name == "metadata" and set(child) - {"type", "properties"}:
            errors.append("metadata: only type/properties(name, generateName) allowed at the root")
        errors += structural_errors(child, f"{path}.{name}", in_junctor=in_junctor, root=False)
    if isinstance(node.get("additionalProperties"), dict):
        errors += structural_errors(
            node["additionalProperties"], f"{path}[*]", in_junctor=in_junctor, root=False
        )
    if isinstance(node.get("items"), dict):
        errors += structural_errors(node["items"], f"{path}[]", in_junctor=in_junctor, root=False)
    for junctor in JUNCTORS:
        branches = node.get(junctor)
        for i, branch in enumerate([branches] if isinstance(branches, dict) else branches or []):
            errors += structural_errors(branch, f"{path}.{junctor}[{i}]", in_junctor=True, root=False)
    return errors


def _schema(kind: str) -> dict:
    (version,) = _crds()[kind]["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


@functools.cache
def _validator(kind: str) -> jsonschema.Draft4Validator:
    """Built once per kind: parsing the CRD files and checking the schema took most of each
    property example's time."""
    schema = _schema(kind)
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def _validate(kind: str, obj: dict) -> None:
    """What `jsonschema.validate` does (the most relevant error raised), on the cached validator."""
    error = jsonschema.exceptions.best_match(_validator(kind).iter_errors(obj))
    if error is not None:
        raise error


def test_every_crd_present() -> None:
    assert set(_crds()) == {"Device", "PodGroup", "Reservation"}


@pytest.mark.parametrize("kind", ["Device", "PodGroup", "Reservation"])
def test_crd_is_structural(kind: str) -> None:
    assert structural_errors(_schema(kind)) == []


def test_checker_catches_non_structural_schemas() -> None:
    bad = {
        "type": "object",
        "properties": {"a": {"properties": {}}, "b": {"anyOf": [{"type": "object", "description": "x"}]}},
    }
    errors = structural_errors(bad)
    assert any(".a: missing type" in e for e in errors)
    assert any("description not allowed" in e for e in errors)


@pytest.mark.parametrize("kind", ["Device", "PodGroup", "Reservation"])
def test_printer_columns_point_at_declared_fields(kind: str) -> None:
    (version,) = _crds()[kind]["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    for column in version["additionalPrinterColumns"]:
        parts = re.split(r"(?<!\\)\.", column["jsonPath"].lstrip("."))
        node = schema
        for part in parts:
            if node.get("type") == "object" and "properties" not in node:
                break  # metadata and free-form maps
            assert part in node.get("properties", {}), f"{column['name']}: {column['jsonPath']}"
            node = node["properties"][part]


def test_koordinator_shaped_device_validates_against_ours() -> None:
    require_shared()
    block = next(
        b for b in re.findall(r"```json\n(.*?)```", PROTOCOL_DOC.read_text(), re.S) if '"kind": "Device"' in b
    )
    _validate("Device", json.loads(block))


def test_schema_rejects_wrong_types() -> None:
    bad = {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1",
        "kind": "Device",
        "spec": {"devices": [{"type": "gpu", "minor": 0}]},
    }
    with pytest.raises(jsonschema.ValidationError, match="health"):
        _validate("Device", bad)
    bad["spec"]["devices"][0].update(health=True, topology={"nodeID": 0, "pcieID": "p"})
    with pytest.raises(jsonschema.ValidationError, match="socketID"):
        _validate("Device", bad)


@settings(max_examples=60, deadline=None)
@given(s.devices())
def test_our_devices_validate_against_our_crd(device: Device) -> None:
    _validate("Device", json.loads(json.dumps(device.to_dict(with_summary=True))))


@settings(max_examples=60, deadline=None)
@given(s.podgroups)
def test_podgroups_validate_against_our_crd(pg: PodGroup) -> None:
    _validate("PodGroup", json.loads(json.dumps(pg.to_dict())))


def test_kustomization_lists_every_crd() -> None:
    kust = yaml.safe_load((CRD_DIR / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(
        p.name for p in CRD_DIR.glob("*.yaml") if p.name != "kustomization.yaml"
    )


def test_repo_layout() -> None:
    for folder in (
        "apis",
        "agent",
        "allocator",
        "daemonset",
        "deploy",
        "tests",
        "hw-fixtures",
        "bench",
        "docs",
    ):
        assert (REPO / folder).is_dir(), folder
    assert Path(REPO / "pyproject.toml").is_file()
