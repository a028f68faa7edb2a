"""The settings part of the values applied to the rendered bases, as the chart's template does.

* `allocator.config` laid on the allocator's shipped configuration (deploy/allocator/config.yaml),
  `agent.config` on the agent's (daemonset/configmap.yaml): a file with settings given is written
  as indented JSON with sorted keys, byte for byte what the chart's `toPrettyJson` writes, so
  that the checksum annotations agree; without settings the shipped file stays as it is.
* `agent.pools`: one more agent DaemonSet and ConfigMap per pool (`topoalloc-agent-<pool>`), on
  the GPU nodes the pool's label selects; the default DaemonSet leaves those nodes.
* `checksum/config` on each workload's pod template: the SHA-256 of its configuration file, so a
  change of settings rolls exactly the pods that read it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import yaml

from apis import keys
from topoalloc.commands.installer.kustomize import Doc
from topoalloc.commands.installer.values import merged

AGENT, ALLOCATOR = "topoalloc-agent", "topoalloc-allocator"
CHECKSUM = "checksum/config"
POOL_LABEL = keys.AGENT_POOL


def config_text(base: str, *layers: Mapping[str, Any] | None) -> str:
    given = [layer for layer in layers if layer]
    if not given:
        return base
    out: Any = yaml.safe_load(base) or {}
    for layer in given:
        out = merged(out, layer)
    return go_pretty_json(out)


_FIXED = "\x00fixed:"


def _numbers(node: Any) -> Any:
    """Numbers as Go's encoding/json prints float64s (Helm reads every YAML number as one)."""
    if isinstance(node, dict):
        return {k: _numbers(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_numbers(v) for v in node]
    if isinstance(node, float):
        if node.is_integer() and abs(node) < 1e21:
            return int(node)
        if 1e-6 <= abs(node) < 1e21 and "e" in repr(node):
            return _FIXED + format(Decimal(repr(node)), "f")  # Go: 0.00001, Python: 1e-05
    return node


def go_pretty_json(data: Any) -> str:
    """`json.MarshalIndent(data, "", "  ")` of Go (sprig's toPrettyJson): sorted keys, HTML
    characters escaped."""
    text = json.dumps(_numbers(data), indent=2, sort_keys=True, ensure_ascii=False)
    text = re.sub(r'"\\u0000fixed:([-0-9.]+)"', r"\1", text)
    for char, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e")):
        text = text.replace(char, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _named(docs: list[Doc], kind: str, name: str) -> Doc | None:
    return next((d for d in docs if d.get("kind") == kind and d["metadata"].get("name") == name), None)


def _annotate(workload: Doc, text: str) -> None:
    meta = workload["spec"]["template"].setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), CHECKSUM: checksum(text)}


def apply_settings(docs: list[Doc], values: Mapping[str, Any]) -> list[Doc]:
    """`docs` with the settings of `values` (allocator, agent) applied; the pools' objects added."""
    allocator = (values.get("allocator") or {}).get("config") or {}
    agent = values.get("agent") or {}
    pools: dict[str, Any] = dict(sorted((agent.get("pools") or {}).items()))
    out = list(docs)
    config = _named(out, "ConfigMap", ALLOCATOR)
    deployment = _named(out, "Deployment", ALLOCATOR)
    if config is not None:
        config["data"]["allocator.yaml"] = config_text(config["data"]["allocator.yaml"], allocator)
        if deployment is not None:
            _annotate(deployment, config["data"]["allocator.yaml"])
    agent_config = _named(out, "ConfigMap", AGENT)
    daemonset = _named(out, "DaemonSet", AGENT)
    if agent_config is None or daemonset is None:
        return out
    base = agent_config["data"]["agent.yaml"]
    agent_config["data"]["agent.yaml"] = config_text(base, agent.get("config"))
    pristine = copy.deepcopy(daemonset)
    for name, pool in pools.items():
        out += _pool(
            name, pool, pristine, agent_config, config_text(base, agent.get("config"), pool.get("config"))
        )
        terms = daemonset["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        for term in terms:
            for key, value in sorted(pool["nodeSelector"].items()):
                term["matchExpressions"].append({"key": key, "operator": "NotIn", "values": [value]})
    _annotate(daemonset, agent_config["data"]["agent.yaml"])
    return out


def _pool(name: str, pool: Mapping[str, Any], daemonset: Doc, configmap: Doc, text: str) -> list[Doc]:
    full = f"{AGENT}-{name}"
    cm = copy.deepcopy(configmap)
    cm["metadata"]["name"] = full
    cm["data"]["agent.yaml"] = text
    ds = copy.deepcopy(daemonset)
    ds["metadata"]["name"] = full
    ds["spec"]["selector"]["matchLabels"][POOL_LABEL] = name
    template = ds["spec"]["template"]
    template["metadata"]["labels"][POOL_LABEL] = name
    template["spec"]["nodeSelector"] = dict(pool["nodeSelector"])
    for volume in template["spec"]["volumes"]:
        if volume["name"] == "config":
            volume["configMap"]["name"] = full
    _annotate(ds, text)
    return [cm, ds]
