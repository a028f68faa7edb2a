"""Reservation objects for the tests (the shape a user writes)."""

from __future__ import annotations

import json
from typing import Any

from apis import reservation as rv

JSON = dict[str, Any]


def reservation(
    name: str,
    *,
    gpus: int = 0,
    requests: dict[str, str] | None = None,
    owners: list[JSON] | None = None,
    annotations: dict[str, Any] | None = None,
    template_annotations: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> JSON:
    """A Reservation whose template asks for `gpus` nvidia.com/gpu (plus `requests`), owned by
    the pods labelled app=<name> unless `owners` says otherwise."""
    res = dict(requests or {})
    if gpus:
        res["nvidia.com/gpu"] = str(gpus)
    tmeta: JSON = {"namespace": "default"}
    if template_annotations:
        tmeta["annotations"] = {
            k: v if isinstance(v, str) else json.dumps(v) for k, v in template_annotations.items()
        }
    meta: JSON = {"name": name}
    if annotations:
        meta["annotations"] = {k: v if isinstance(v, str) else json.dumps(v) for k, v in annotations.items()}
    if labels:
        meta["labels"] = labels
    body: JSON = {
        "template": {
            "metadata": tmeta,
            "spec": {"containers": [{"name": "main", "resources": {"requests": res, "limits": dict(res)}}]},
        },
        "owners": owners if owners is not None else [{"labelSelector": {"matchLabels": {"app": name}}}],
        **spec,
    }
    return {"apiVersion": rv.API_VERSION, "kind": rv.KIND, "metadata": meta, "spec": body}
