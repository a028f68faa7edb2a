"""The RBAC the project's manifests grant its own ServiceAccounts, one verb on one resource at a
time, and the comparison with what those accounts were seen to request (tests/support/api_audit.py).

Rules are read from the kustomize bases users apply (deploy/, its extender and secondary-scheduler
variants, daemonset/), so a Role added anywhere there is covered. Bindings to roles the manifests do
not define (kube-scheduler's built-in ones) are Kubernetes' grants, not ours: left out. A request
is matched the way kube-apiserver's RBAC authorizer matches it: group, resource with its
subresource, verb, the Role's namespace, and `resourceNames` (which never cover `create`, `list`,
`watch` or `deletecollection`, whose requests carry no name to check).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.api_audit import Request
from tests.support.kube_releases import REPO
from topoalloc.commands.installer.kustomize import build

BASES = ("deploy", "deploy/extender", "deploy/secondary-scheduler", "daemonset")
# Paths every authenticated user may read by Kubernetes' own roles (system:discovery,
# system:public-info-viewer): a refusal of one means the authorizer had not loaded its roles yet (a
# kube-apiserver just restarted), never a rule the manifests lack.
_PUBLIC_PATHS = re.compile(r"/(api|apis)(/[^/]+){0,2}/?|/version/?|/openapi/.*|/healthz|/livez|/readyz")
_NAMELESS_VERBS = frozenset({"create", "list", "watch", "deletecollection"})


@dataclass(frozen=True, order=True)
class Grant:
    """One verb on one resource (`pods/status` for a subresource) granted to `user` by `role`
    (`ClusterRole/x`, or `Role/ns/x` with `namespace` set), limited to `names` when it has any."""

    user: str
    role: str
    group: str
    resource: str
    verb: str
    namespace: str = ""
    names: tuple[str, ...] = ()

    def covers(self, request: Request) -> bool:
        if request.user != self.user or not request.resource:
            return False
        if self.group not in ("*", request.group) or self.verb not in ("*", request.verb):
            return False
        if self.resource not in ("*", request.full_resource):
            return False
        if self.namespace and request.namespace != self.namespace:
            return False
        if self.names:
            return request.verb not in _NAMELESS_VERBS and request.name in self.names
        return True

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        names = f" {list(self.names)}" if self.names else ""
        group = self.group or "core"
        return f"{self.role}: {self.verb} {group}/{self.resource}{names}{where}"


def manifests(bases: Iterable[str] = BASES, repo: Path = REPO) -> list[dict[str, Any]]:
    """The RBAC objects of the bases (each once, by kind, namespace and name)."""
    found: dict[tuple[str, str, str], dict[str, Any]] = {}
    for base in bases:
        for doc in build(repo / base):
            if doc and doc.get("apiVersion", "").startswith("rbac.authorization.k8s.io/"):
                meta = doc["metadata"]
                found.setdefault((doc["kind"], meta.get("namespace", ""), meta["name"]), doc)
    return list(found.values())


def grants(objects: Iterable[Mapping[str, Any]]) -> list[Grant]:
    """Every (user, verb, resource) the objects' bindings grant through roles they define."""
    objects = list(objects)
    roles = {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
        for o in objects
        if o["kind"] in ("Role", "ClusterRole")
    }
    out: set[Grant] = set()
    for binding in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        namespace = binding["metadata"].get("namespace", "") if binding["kind"] == "RoleBinding" else ""
        ref = binding["roleRef"]
        role = roles.get((ref["kind"], namespace if ref["kind"] == "Role" else "", ref["name"]))
        if role is None:
            continue
        label = f"{ref['kind']}/{namespace + '/' if ref['kind'] == 'Role' else ''}{ref['name']}"
        for subject in binding.get("subjects") or []:
            if subject.get("kind") != "ServiceAccount":
                continue
            user = f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
            for rule in role.get("rules") or []:
                names = tuple(rule.get("resourceNames") or ())
                for group in rule.get("apiGroups") or []:
                    for resource in rule.get("resources") or []:
                        for verb in rule.get("verbs") or []:
                            out.add(Grant(user, label, group, resource, verb, namespace, names))
    return sorted(out)


@dataclass(frozen=True)
class Verdict:
    unused: list[Grant]  # granted, never requested, not on the allowlist
    missing: list[Request]  # refused by the authorizer and covered by no grant
    allowed_unused: list[Grant]  # unused and on the allowlist (with its reason there)
    stale_allowlist: list[Grant]  # on the allowlist but requested after all: take it off
    # allowed, yet covered by no grant of the manifests, for an account that holds no other role:
    # something else authorized it (a binding the manifests do not make)
    uncovered: list[Request]


def verdict(
    granted: Iterable[Grant],
    requests: Iterable[Request],
    allowlist: Mapping[Grant, str] | None = None,
    *,
    only_ours: Iterable[str] = (),
) -> Verdict:
    """`only_ours`: the accounts whose every right the manifests' own roles give (not the secondary
    scheduler, which holds kube-scheduler's built-in roles too)."""
    granted, requests, only_ours = list(granted), list(requests), set(only_ours)
    allowlist = dict(allowlist or {})
    checked = {g.user for g in granted}
    used = {g for g in granted if any(g.covers(r) for r in requests if not r.denied)}
    unused = [g for g in granted if g not in used]
    missing = [
        r
        for r in requests
        if r.denied and r.user in checked and not _public(r) and not any(g.covers(r) for g in granted)
    ]
    return Verdict(
        unused=[g for g in unused if g not in allowlist],
        missing=sorted(set(missing)),
        allowed_unused=[g for g in unused if g in allowlist],
        stale_allowlist=sorted(g for g in allowlist if g in used),
        uncovered=sorted(
            {
                r
                for r in requests
                if r.user in only_ours
                and r.resource
                and not r.denied
                and not any(g.covers(r) for g in granted)
            }
        ),
    )


def _public(request: Request) -> bool:
    return not request.resource and request.verb == "get" and bool(_PUBLIC_PATHS.fullmatch(request.name))


def table(granted: Iterable[Grant], requests: Mapping[Request, int]) -> list[tuple[str, int]]:
    """Each grant with the number of requests it covered (what docs/security.md shows)."""
    return [(str(g), sum(n for r, n in requests.items() if not r.denied and g.covers(r))) for g in granted]
