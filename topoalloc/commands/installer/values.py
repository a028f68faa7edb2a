"""The chart's values: what `helm install` and `topoalloc install --values/--set` both take.

One schema: `schema()` derives the settings part of charts/topoalloc/values.schema.json from the
config loaders themselves (the allocator's ServiceConfig dataclasses and the agent's AgentConfig:
their keys, as the loaders spell them, and the kinds of value each loader accepts), and
`make chart` writes it into the chart; a test holds the file equal to this function. Helm checks
values against the file; the installer checks them against the same file (`validate`, a small
reader of the JSON-schema subset the file uses) and then runs the loaders on the merged settings,
so range checks that live in the loaders' code (a weight of 1 to 100) are refused by
`topoalloc install` before anything is applied, and by the allocator or agent at start under Helm.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from agent.config import UDEV_SOURCES, AgentConfig, ConfigError, load_config
from allocator.runtime.config import ROUND_TRIPS, ServiceConfig
from allocator.runtime.defrag_settings import CAPS, PERIODS
from allocator.runtime.placement_settings import PINS
from allocator.runtime.scarce_settings import WEIGHT_RANGE
from apis.dra import MODES as DEVICE_MODES
from apis.topology_profile import PROFILE_NAMES

Values = dict[str, Any]
# Enumerations the loaders hold as constants: (loader, dotted key) -> allowed values.
_ENUMS: dict[tuple[str, str], list[Any]] = {
    ("allocator", "roundTrips"): list(ROUND_TRIPS),
    ("agent", "mode"): list(DEVICE_MODES),
    ("agent", "udevSource"): list(UDEV_SOURCES),
    ("allocator", "placement.pin"): list(PINS),
    ("allocator", "gang.topologyProfile"): list(PROFILE_NAMES),
}


class ValuesError(ValueError):
    """Values the schema or a loader refuses: `where` is the dotted key."""


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _bounds(loader: str, key: str) -> dict[str, Any]:
    """The bounds the loaders hold as constants, as JSON-schema keywords."""
    if loader != "allocator":
        return {}
    if key == "scarceAvoidance.weight":
        return {"minimum": WEIGHT_RANGE[0], "maximum": WEIGHT_RANGE[1]}
    section, _, name = key.partition(".")
    if section == "defrag" and name in PERIODS:
        return {"exclusiveMinimum": 0}
    if section == "defrag" and name in CAPS:
        return {"minimum": 0}
    return {}


def _leaf(loader: str, current: Any, annotation: Any) -> dict[str, Any]:
    """The JSON schema of one setting, from its default as the loader judges it."""
    nullable = "None" in str(annotation)
    if isinstance(current, bool) or annotation == "bool":
        out: dict[str, Any] = {"type": "boolean"}
    elif isinstance(current, int) and loader == "allocator":
        out = {"type": "integer"}
    elif isinstance(current, float) and loader == "allocator":
        out = {"type": "number", "minimum": 0}
    elif isinstance(current, int | float):
        out = {"type": "number"}  # the agent converts any number to the setting's kind
    elif isinstance(current, tuple):
        out = {"type": "array", "items": {"type": "integer"}}
    elif isinstance(current, list):
        out = {"type": "array", "items": {"type": "string"}}
    elif isinstance(current, dict):
        out = {"type": "object"}
        if loader == "agent":
            out["additionalProperties"] = {"type": ["string", "number", "boolean"]}
    else:
        out = {"type": "string"}
    if nullable:
        out["type"] = [out["type"], "null"]
    return out


def _object(loader: str, instance: Any, prefix: str = "") -> dict[str, Any]:
    props: dict[str, Any] = {}
    for f in dataclasses.fields(instance):
        current = getattr(instance, f.name)
        key = _camel(f.name)
        if loader == "agent" and f.name == "partition_rules":
            props["partitions"] = _partitions()
            continue
        if dataclasses.is_dataclass(current):
            props[key] = _object(loader, current, f"{prefix}{key}.")
        else:
            props[key] = _leaf(loader, current, f.type)
        enum = _ENUMS.get((loader, prefix + key))
        if enum is not None:
            props[key]["enum"] = enum
        props[key].update(_bounds(loader, prefix + key))
    return {"type": "object", "additionalProperties": False, "properties": props}


def _partitions() -> dict[str, Any]:
    rule = {
        "type": "object",
        "additionalProperties": False,
        "required": ["model"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "policy": {"type": "string", "enum": ["", "Honor", "Prefer"]},
            "table": {"type": ["string", "object", "null"]},
        },
    }
    rules = {"type": "array", "items": rule}
    return {"type": "object", "additionalProperties": False, "properties": {"rules": rules}}


def settings_schemas() -> dict[str, dict[str, Any]]:
    """The allocator's and the agent's settings, as JSON schemas."""
    # Instances built without the environment-derived defaults mattering: only kinds are read.
    return {"allocator": _object("allocator", ServiceConfig()), "agent": _object("agent", AgentConfig())}


def _pools(agent: dict[str, Any]) -> dict[str, Any]:
    pool = {
        "type": "object",
        "additionalProperties": False,
        "required": ["nodeSelector"],
        "properties": {
            # One label: the default pool runs on every GPU node that no pool's label selects.
            "nodeSelector": {
                "type": "object",
                "minProperties": 1,
                "maxProperties": 1,
                "additionalProperties": {"type": "string"},
            },
            "config": agent,
        },
    }
    return {
        "type": "object",
        "propertyNames": {"pattern": "^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$"},
        "additionalProperties": pool,
    }


def schema() -> dict[str, Any]:
    """The whole values.schema.json."""
    settings = settings_schemas()
    string = {"type": "string"}
    flag = {"type": "boolean"}
    props = {
        "image": _closed({"repository": string, "tag": string}),
        "mode": _enum(["placement", "secondary", "kubeadm"]),
        "certs": _enum(["generate", "cert-manager"]),
        "gangWebhookFailurePolicy": _enum(["", "Ignore", "Fail"]),
        "scheduler": _closed(
            {"image": string, "version": {"type": "string", "pattern": r"^(v\d+\.\d+\.\d+)?$"}}
        ),
        "monitoring": flag,
        "nvidiaRuntimeClass": flag,
        "deviceClasses": flag,
        "allocator": _closed({"config": settings["allocator"]}),
        "agent": _closed({"config": settings["agent"], "pools": _pools(settings["agent"])}),
        "global": {"type": "object"},  # Helm passes a parent chart's globals
    }
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "topoalloc chart values (written by `make chart` from the config loaders)",
        **_closed(props),
    }


def _closed(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": props}


def _enum(choices: list[str]) -> dict[str, Any]:
    return {"type": "string", "enum": choices}


_KINDS = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "null": lambda v: v is None,
}


def check(value: Any, node: Mapping[str, Any], where: str = "") -> None:
    """Raise ValuesError where `value` breaks `node` (the keywords `schema()` writes)."""
    import re

    kinds = node.get("type")
    if kinds is not None:
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if not any(_KINDS[k](value) for k in kinds):
            raise ValuesError(f"{where or 'values'}: expected {' or '.join(kinds)}, got {value!r}")
    if "enum" in node and value not in node["enum"]:
        raise ValuesError(f"{where}: expected one of {', '.join(map(str, node['enum']))}, got {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in node and value < node["minimum"]:
            raise ValuesError(f"{where}: expected {node['minimum']} or more, got {value!r}")
        if "maximum" in node and value > node["maximum"]:
            raise ValuesError(f"{where}: expected {node['maximum']} or less, got {value!r}")
        if "exclusiveMinimum" in node and value <= node["exclusiveMinimum"]:
            raise ValuesError(f"{where}: expected more than {node['exclusiveMinimum']}, got {value!r}")
    if isinstance(value, str):
        if "pattern" in node and not re.search(node["pattern"], value):
            raise ValuesError(f"{where}: {value!r} does not match {node['pattern']}")
        if len(value) < node.get("minLength", 0):
            raise ValuesError(f"{where}: must not be empty")
    if isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            check(item, node["items"], f"{where}[{i}]")
    if isinstance(value, dict):
        _check_object(value, node, where)


def _check_object(value: dict[str, Any], node: Mapping[str, Any], where: str) -> None:
    import re

    props = node.get("properties") or {}
    extra = node.get("additionalProperties", True)
    for key in node.get("required") or []:
        if key not in value:
            raise ValuesError(f"{where}: needs {key}")
    if len(value) < node.get("minProperties", 0) or len(value) > node.get("maxProperties", len(value)):
        raise ValuesError(
            f"{where}: expected {node.get('minProperties')} to {node.get('maxProperties')} keys"
        )
    names = (node.get("propertyNames") or {}).get("pattern")
    for key, item in value.items():
        at = f"{where}.{key}" if where else str(key)
        if names and not re.search(names, str(key)):
            raise ValuesError(f"{at}: not a valid name (lowercase letters, digits and -)")
        if key in props:
            check(item, props[key], at)
        elif extra is False:
            known = ", ".join(sorted(props))
            raise ValuesError(f"{at}: unknown setting (known: {known})")
        elif isinstance(extra, dict):
            check(item, extra, at)


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` laid on `base`: mappings merged key by key, anything else replaced (as Helm merges
    values files and as the chart's `topoalloc.merge` lays settings on a base config)."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if value is None:  # as with helm: null takes a key away (`--set agent.pools.dra=null`)
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_set(assignment: str) -> Values:
    """`a.b.c=value` as {a: {b: {c: value}}}; the value read as YAML (`true`, `2`, `[a, b]`; helm
    writes a list `{a,b}`)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ValuesError(f"--set {assignment!r}: expected key=value")
    text = raw.strip()
    if text.startswith("{") and text.endswith("}") and ":" not in text:  # helm's list: {a,b}
        value: Any = [yaml.safe_load(item) for item in text[1:-1].split(",") if item.strip()]
    else:
        value = yaml.safe_load(raw) if text else ""
    # `\.` is a dot inside a key, as with helm: nodeSelector.topoalloc\.io/agent-pool=dra
    parts = [p.replace("\x00", ".") for p in key.strip().replace("\\.", "\x00").split(".")]
    for part in reversed(parts):
        value = {part: value}
    return value


def load_values(files: Iterable[Path], assignments: Iterable[str], start: Values | None = None) -> Values:
    """`start` with each values file, then each --set, laid on it in order."""
    out: Values = dict(start or {})
    for path in files:
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValuesError(f"{path}: expected a mapping")
        out = merged(out, data)
    for assignment in assignments:
        out = merged(out, parse_set(assignment))
    return out


def validate(values: Values, chart_schema: Mapping[str, Any]) -> None:
    """The schema's verdict, then the loaders' on each settings block."""
    check(values, chart_schema)
    allocator = ((values.get("allocator") or {}).get("config")) or {}
    try:
        ServiceConfig.from_mapping(copy.deepcopy(allocator))
    except ValueError as exc:
        raise ValuesError(f"allocator.config: {exc}") from None
    agent = values.get("agent") or {}
    blocks = {"agent.config": agent.get("config") or {}}
    for name, pool in (agent.get("pools") or {}).items():
        blocks[f"agent.pools.{name}.config"] = merged(blocks["agent.config"], pool.get("config") or {})
    for where, block in blocks.items():
        try:
            agent_settings(block)
        except (ConfigError, ValueError) as exc:
            raise ValuesError(f"{where}: {exc}") from None


def agent_settings(block: Mapping[str, Any]) -> AgentConfig:
    """The agent's loader run on a settings block (it reads files: hand it one)."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as handle:
        json.dump(dict(block), handle)
        handle.flush()
        return load_config(handle.name)
