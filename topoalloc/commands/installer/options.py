"""The chart's values as `topoalloc install/upgrade` options (--values FILE, --set key=value).

The keys that name a choice the installer also has a flag for (image, mode, certs, ...) set that
option; `allocator` and `agent` (settings and pools) are kept as they are, recorded with the other
options, and applied by settings.py. Values are checked against the chart's schema and the config
loaders (values.validate) before anything is rendered.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from topoalloc.commands.installer.manifests import InstallOptions
from topoalloc.commands.installer.values import Values, load_values, merged, schema, validate

# value path -> InstallOptions field
OPTION_KEYS = {
    ("image", "repository"): "image",
    ("image", "tag"): "version",
    ("mode",): "mode",
    ("certs",): "certs",
    ("gangWebhookFailurePolicy",): "gang_failure_policy",
    ("scheduler", "image"): "scheduler_image",
    ("scheduler", "version"): "scheduler_version",
    ("monitoring",): "monitoring",
    ("nvidiaRuntimeClass",): "nvidia_runtime_class",
    ("deviceClasses",): "device_classes",
}
SETTINGS = ("allocator", "agent")


def _get(values: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = values
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def with_values(base: InstallOptions, files: Iterable[Path] = (), sets: Iterable[str] = ()) -> InstallOptions:
    """`base` (the recorded options, or the defaults) with the values of `files` and `sets` laid on
    it: options set, settings merged into the recorded ones. Raises ValuesError."""
    given = load_values(files, sets)
    if not given:
        return base
    settings = merged(base.settings(), {k: given[k] for k in SETTINGS if k in given})
    validate({**given, **settings}, schema())
    changes: dict[str, Any] = {}
    for path, name in OPTION_KEYS.items():
        value = _get(given, path)
        if value is not None and value != "":
            changes[name] = value
    return replace(base, values=json.dumps(settings, sort_keys=True) if settings else "", **changes)


def chart_values(options: InstallOptions) -> Values:
    """The chart values that render what `options` render (tests, release YAML)."""
    out: Values = {}
    for path, name in OPTION_KEYS.items():
        value = getattr(options, name)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return {**out, **options.settings()}
