"""Discovery documents (`/version`, `/api`, `/api/v1`, `/apis`, `/apis/{g}`, `/apis/{g}/{v}`) built from the
registered resource types, in the legacy (unaggregated) format every client understands."""

from __future__ import annotations

from typing import Any

from .resources import Registry, ResourceType

JsonObj = dict[str, Any]

VERSION_INFO: JsonObj = {
    "major": "1",
    "minor": "32",
    "emulationMajor": "1",
    "emulationMinor": "32",
    "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "31",
    "gitVersion": "v1.32.13",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-11-01T00:00:00Z",
    "goVersion": "go1.23.12",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def core_versions(server_address: str) -> JsonObj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group_doc(name: str, versions: list[str]) -> JsonObj:
    listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": listed, "preferredVersion": listed[0]}


def group_list(types: Registry) -> JsonObj:
    groups = [_group_doc(name, versions) for name, versions in types.groups().items()]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def group(types: Registry, name: str) -> JsonObj | None:
    versions = types.groups().get(name)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(name, versions)}


def resource_list(types: Registry, group_name: str, version: str) -> JsonObj | None:
    members = types.in_group_version(group_name, version)
    if not members:
        return None
    resources: list[JsonObj] = []
    for rt in members:
        resources.append(_resource_entry(rt))
        if rt.status_subresource:
            resources.append(_subresource_entry(rt, "status", rt.kind, ["get", "patch", "update"]))
        for sub, (kind, verbs) in rt.extra_subresources.items():
            resources.append(_subresource_entry(rt, sub, kind, list(verbs)))
    group_version = f"{group_name}/{version}" if group_name else version
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


def _resource_entry(rt: ResourceType) -> JsonObj:
    entry: JsonObj = {
        "name": rt.plural,
        "singularName": rt.singular or rt.kind.lower(),
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": list(_VERBS),
    }
    if rt.short_names:
        entry["shortNames"] = list(rt.short_names)
    return entry


def _subresource_entry(rt: ResourceType, sub: str, kind: str, verbs: list[str]) -> JsonObj:
    return {
        "name": f"{rt.plural}/{sub}",
        "singularName": "",
        "namespaced": rt.namespaced,
        "kind": kind,
        "verbs": verbs,
    }
