"""Resource types served by the fake: names, scope, subresources and per-kind behaviour."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .behaviour import KindBehaviour
    from .strategic import Schema

JsonObj = dict[str, Any]
FieldGetter = Callable[[JsonObj], str]


def _metadata_getter(name: str) -> FieldGetter:
    return lambda obj: str(obj.get("metadata", {}).get(name) or "")


METADATA_FIELDS: Mapping[str, FieldGetter] = {
    "metadata.name": _metadata_getter("name"),
    "metadata.namespace": _metadata_getter("namespace"),
}


def path_getter(*path: str) -> FieldGetter:
    """A field-selector getter for a nested string/bool field; booleans read as `true`/`false`."""

    def get(obj: JsonObj) -> str:
        value: Any = obj
        for part in path:
            if not isinstance(value, dict):
                return ""
            value = value.get(part)
        if isinstance(value, bool):
            return "true" if value else "false"
        return "" if value is None else str(value)

    return get


@dataclass(frozen=True)
class ViewConversion:
    """Converts between a view's representation and the storage representation it shares."""

    to_view: Callable[[JsonObj], JsonObj]
    from_view: Callable[[JsonObj], JsonObj]


@dataclass(frozen=True)
class ResourceType:
    """One REST resource (`pods`, `leases.coordination.k8s.io`, a CRD's plural)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    behaviour: KindBehaviour
    singular: str = ""
    short_names: tuple[str, ...] = ()
    # The `/status` subresource: main writes keep the stored status, status writes change only status.
    status_subresource: bool = True
    # Custom resources: JSON objects with sorted keys, kind/apiVersion in list items, no strategic merge
    # patch, `metadata.generation`, and PUT requires `metadata.resourceVersion`.
    custom: bool = False
    tracks_generation: bool = False
    allow_create_on_update: bool = False
    field_getters: Mapping[str, FieldGetter] = field(default_factory=lambda: dict(METADATA_FIELDS))
    # Strategic-merge-patch schema (lists merged by key); None when the resource does not accept SMP.
    merge_schema: Schema | None = None
    # What a BOOKMARK object carries besides kind/apiVersion/metadata (the Go zero value of the type).
    bookmark_body: JsonObj = field(default_factory=dict)
    # Another resource whose stored objects this one presents in its own shape (events.k8s.io/v1 events).
    storage_of: str = ""
    view: ViewConversion | None = None
    # Subresources beyond `status`, with their discovery kind and verbs (`binding` → Binding, create).
    extra_subresources: Mapping[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """Unique name: `pods`, `leases.coordination.k8s.io`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def storage_key(self) -> str:
        return self.storage_of or self.key

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def subresources(self) -> tuple[str, ...]:
        names = ("status",) if self.status_subresource else ()
        return names + tuple(self.extra_subresources)

    def stamp(self, obj: JsonObj) -> JsonObj:
        """The object with `kind` and `apiVersion` first, as the apiserver writes them."""
        body = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
        return {"kind": self.kind, "apiVersion": self.api_version, **body}


class Registry:
    """All resource types the fake serves, found by URL coordinates or by a short name."""

    def __init__(self) -> None:
        self._by_url: dict[tuple[str, str, str], ResourceType] = {}

    def add(self, rt: ResourceType) -> None:
        coords = (rt.group, rt.version, rt.plural)
        if coords in self._by_url:
            raise ValueError(f"resource {rt.key} {rt.version} is already registered")
        self._by_url[coords] = rt

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_url.get((group, version, plural))

    def resolve(self, name: str) -> ResourceType:
        """Find a type by `plural`, `plural.group`, kind or short name (for test hooks)."""
        matches = [
            rt
            for rt in self._by_url.values()
            if name in (rt.key, rt.plural, rt.kind, rt.singular, *rt.short_names) and not rt.storage_of
        ]
        exact = [rt for rt in matches if rt.key == name]
        if exact:
            return exact[0]
        if len(matches) != 1:
            known = ", ".join(sorted(rt.key for rt in self._by_url.values()))
            raise KeyError(f"no single resource type named {name!r} (known: {known})")
        return matches[0]

    def by_kind(self, api_version: str, kind: str) -> ResourceType:
        for rt in self._by_url.values():
            if rt.api_version == api_version and rt.kind == kind:
                return rt
        raise KeyError(f"no resource type for apiVersion {api_version!r} kind {kind!r}")

    def groups(self) -> dict[str, list[str]]:
        """Group name → versions, in registration order (core group excluded)."""
        out: dict[str, list[str]] = {}
        for rt in self._by_url.values():
            if rt.group:
                versions = out.setdefault(rt.group, [])
                if rt.version not in versions:
                    versions.append(rt.version)
        return out

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [rt for rt in self._by_url.values() if rt.group == group and rt.version == version]
