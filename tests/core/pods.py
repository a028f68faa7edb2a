"""Small builders for Pod dicts used across the core tests."""

from __future__ import annotations

import json
from typing import Any

from apis import keys


def pod(
    requests: dict[str, str] | None = None,
    *,
    name: str = "p",
    namespace: str = "default",
    annotations: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    init: list[dict[str, Any]] | None = None,
    overhead: dict[str, str] | None = None,
    containers: list[dict[str, str]] | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    """A pod whose single container requests `requests` (limits equal), or several `containers`."""
    conts = containers if containers is not None else [requests or {}]
    spec: dict[str, Any] = {
        "containers": [
            {"name": f"c{i}", "resources": {"requests": dict(r), "limits": dict(r)}}
            for i, r in enumerate(conts)
        ]
    }
    if init is not None:
        spec["initContainers"] = init
    if overhead is not None:
        spec["overhead"] = overhead
    if node is not None:
        spec["nodeName"] = node
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = {k: v if isinstance(v, str) else json.dumps(v) for k, v in annotations.items()}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def hint(**by_type: Any) -> dict[str, Any]:
    return {keys.DEVICE_ALLOCATE_HINT: by_type}


def joint(*types: str, same_pcie: bool = True) -> dict[str, Any]:
    value: dict[str, Any] = {"deviceTypes": list(types)}
    if same_pcie:
        value["requiredScope"] = "SamePCIe"
    return {keys.DEVICE_JOINT_ALLOCATE: value}


def gpus(n: int, **extra: str) -> dict[str, str]:
    return {"nvidia.com/gpu": str(n), **extra}
