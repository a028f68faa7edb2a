"""Claims allocated by topoalloc on the real control plane: objects the tests create, and the core's
own answer for the cluster as the API server has it (a watch cache filled from LISTs, the same code
the allocator runs), to compare what the allocator wrote with. No pytest here."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from allocator.core.claims.solve import ClaimAnswer, solve
from allocator.core.request.claims import ClaimsRequest, translate
from allocator.runtime.cache.store import ClusterCache
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.kube import (
    DEVICECLASSES,
    DEVICES,
    NODES,
    PODS,
    RESOURCECLAIMS,
    RESOURCECLAIMTEMPLATES,
    RESOURCESLICES,
    Kind,
)
from apis import dra
from apis.dra_claims import DeviceClass, claim_spec
from tests.cluster.dra import CLAIMS, TEMPLATES
from tests.cluster.harness import ClusterEnv
from tests.support.controlplane import REPO, wait_until

JSON = dict[str, Any]
EXAMPLES = sorted((REPO / "examples" / "dra").glob("*.yaml"))
OPT_OUT = {dra.ALLOCATOR_ANNOTATION: dra.ALLOCATOR_KUBE_SCHEDULER}


def _path(kind: Kind) -> str:
    if kind.group:
        return f"/apis/{kind.group}/{kind.version}/{kind.plural}"
    return f"/api/{kind.version}/{kind.plural}"


def cache_of(cluster: ClusterEnv) -> ClusterCache:
    """A watch cache filled from one LIST of every kind the allocator watches."""
    cache = ClusterCache(CoreAdapter())
    for kind in (NODES, DEVICES, DEVICECLASSES, RESOURCESLICES, RESOURCECLAIMTEMPLATES, RESOURCECLAIMS, PODS):
        cache.replace(kind, cluster.cp.admin.get(_path(kind))["items"])
    return cache


def core_answer(cache: ClusterCache, node: str, devices: JSON, pod: JSON) -> ClaimAnswer | None:
    """The core's choice on `node` for one claim of `devices` made for `pod` (key `c`); None
    where it refuses it."""
    classes = {k: v for k, v in cache.dra.classes.items() if isinstance(v, DeviceClass)}
    creq = translate(cache.core.request(pod), [("c", claim_spec(devices, ""))], classes)
    assert isinstance(creq, ClaimsRequest), creq
    answer = solve(cache.core.cluster.nodes[node], creq, cache.dra.published.get(node))
    return answer if isinstance(answer, ClaimAnswer) else None


def example(path: Path, ns: str, *, annotations: dict[str, str] | None = None) -> tuple[JSON, JSON]:
    """The example's template and pod in `ns`, the template's claims annotated with `annotations`."""
    template, pod = (copy.deepcopy(d) for d in yaml.safe_load_all(path.read_text()))
    if annotations:
        template["spec"].setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)
    for doc in (template, pod):
        doc["metadata"]["namespace"] = ns
    return template, pod


def gpu_template(name: str, count: int, ns: str, *, annotations: dict[str, str] | None = None) -> JSON:
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "metadata": {"annotations": annotations or {}},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpus", "exactly": {"deviceClassName": dra.GPU_CLASS, "count": count}}
                    ]
                }
            },
        },
    }


def claim_pod(
    name: str, template: str, ns: str, *, node: str = "", requests: dict[str, str] | None = None
) -> JSON:
    res = {"cpu": "1", "memory": "1Gi", **(requests or {})}
    spec: JSON = {
        "resourceClaims": [{"name": "devices", "resourceClaimTemplateName": template}],
        "containers": [
            {
                "name": "main",
                "image": "registry.example/train:1",
                "resources": {"requests": dict(res), "limits": dict(res), "claims": [{"name": "devices"}]},
            }
        ],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec}


def create_template(cluster: ClusterEnv, template: JSON) -> None:
    cluster.cp.admin.post(TEMPLATES.format(ns=template["metadata"]["namespace"]), template)


def claims(cluster: ClusterEnv, ns: str) -> list[JSON]:
    return list(cluster.cp.admin.get(CLAIMS.format(ns=ns))["items"])


def claim_of(cluster: ClusterEnv, ns: str, pod: str) -> JSON:
    """The pod's (one) claim, once kube-controller-manager made it."""
    return wait_until(
        lambda: next((c for c in claims(cluster, ns) if _owner(c) == pod), None),
        timeout=30,
        what=f"the claim of {ns}/{pod}",
    )


def allocated_claim(cluster: ClusterEnv, ns: str, pod: str, timeout: float = 60.0) -> JSON:
    return wait_until(
        lambda: (c := claim_of(cluster, ns, pod)).get("status", {}).get("allocation") and c,
        timeout=timeout,
        what=f"the claim of {ns}/{pod} allocated",
    )


def _owner(claim: JSON) -> str:
    refs = claim["metadata"].get("ownerReferences") or []
    return next((r["name"] for r in refs if r.get("kind") == "Pod"), "")


def results(claim: JSON) -> list[tuple[str, str]]:
    """(request, device) of each result."""
    return [(r["request"], r["device"]) for r in claim["status"]["allocation"]["devices"]["results"]]


def node_of(claim: JSON) -> str:
    term = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]
    return str(term["matchFields"][0]["values"][0])


def gates(cluster: ClusterEnv, ns: str, pod: str) -> list[str]:
    return [g["name"] for g in cluster.pod(ns, pod)["spec"].get("schedulingGates") or []]


def event_notes(cluster: ClusterEnv, ns: str, reason: str) -> list[str]:
    return [e.get("message") or "" for e in cluster.events(ns) if e.get("reason") == reason]


def cleanup(cluster: ClusterEnv, ns: str) -> None:
    """Pods gone (grace 0, no kubelet), their claims deleted by kube-controller-manager."""
    cluster.delete_pods(ns)
    wait_until(lambda: not claims(cluster, ns), timeout=60, what=f"the claims of {ns} deleted")
