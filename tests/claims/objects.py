"""ResourceClaims, templates and pods that name them, as the DRA tests write them."""

from __future__ import annotations

from typing import Any

from apis import dra

JSON = dict[str, Any]


def template(name: str, devices: JSON, *, annotations: dict[str, str] | None = None) -> JSON:
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"metadata": {"annotations": annotations or {}}, "spec": {"devices": devices}},
    }


def claim(name: str, devices: JSON, *, annotations: dict[str, str] | None = None) -> JSON:
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
        "spec": {"devices": devices},
    }


def gpus(count: int = 1, *, match: str = "", selectors: tuple[str, ...] = ()) -> JSON:
    exactly: JSON = {"deviceClassName": dra.GPU_CLASS, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    out: JSON = {"requests": [{"name": "gpus", "exactly": exactly}]}
    if match:
        out["constraints"] = [{"requests": ["gpus"], "matchAttribute": match}]
    return out


def claim_pod(
    name: str,
    *,
    templates: dict[str, str] | None = None,
    claims: dict[str, str] | None = None,
    cpu: str = "1",
) -> JSON:
    refs = [{"name": k, "resourceClaimTemplateName": v} for k, v in (templates or {}).items()]
    refs += [{"name": k, "resourceClaimName": v} for k, v in (claims or {}).items()]
    res = {"cpu": cpu, "memory": "1Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "resourceClaims": refs,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/cuda:12",
                    "resources": {
                        "requests": res,
                        "limits": res,
                        "claims": [{"name": r["name"]} for r in refs],
                    },
                }
            ],
        },
    }
