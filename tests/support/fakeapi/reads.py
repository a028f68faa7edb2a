"""The generic registry's reads: an object, a list (paged by continue tokens, or as of a resourceVersion)
and the shapes a stored object is shown in."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from . import errors
from .resources import Registry, ResourceType
from .selectors import FieldSelector, LabelSelector
from .store import Store, TooOld, object_key

JsonObj = dict[str, Any]


@dataclass(frozen=True)
class ListQuery:
    labels: LabelSelector = field(default_factory=LabelSelector)
    fields: FieldSelector = field(default_factory=FieldSelector)
    resource_version: str = ""
    resource_version_match: str = ""
    limit: int = 0
    continue_token: str = ""


class ReadOperations:
    """The registry over a `Store` of the `Registry`'s types; `Operations` builds the writes on it."""

    def __init__(self, types: Registry, store: Store, *, require_namespaces: bool = True) -> None:
        self.types = types
        self.store = store
        self.require_namespaces = require_namespaces

    # -- shapes --------------------------------------------------------------------------------------
    def storage_type(self, rt: ResourceType) -> ResourceType:
        if not rt.storage_of:
            return rt
        return self.types.resolve(rt.storage_of)

    def present(self, rt: ResourceType, stored: JsonObj) -> JsonObj:
        """A stored object as `rt` shows it: converted for views, kind/apiVersion first."""
        return rt.stamp(rt.view.to_view(stored) if rt.view else stored)

    def list_item(self, rt: ResourceType, stored: JsonObj) -> JsonObj:
        """List items of built-in kinds carry no kind/apiVersion; custom resources keep theirs."""
        shown = self.present(rt, stored)
        if rt.custom:
            return shown
        return {k: v for k, v in shown.items() if k not in ("kind", "apiVersion")}

    def _to_storage(self, rt: ResourceType, obj: JsonObj) -> JsonObj:
        srt = self.storage_type(rt)
        return srt.stamp(rt.view.from_view(obj) if rt.view else obj)

    # -- reads ---------------------------------------------------------------------------------------
    def get(self, rt: ResourceType, namespace: str, name: str) -> JsonObj:
        return self.present(rt, self._stored(rt, namespace, name))

    def _stored(self, rt: ResourceType, namespace: str, name: str) -> JsonObj:
        obj = self.store.get(rt.storage_key, namespace, name)
        if obj is None:
            raise errors.not_found(rt, name)
        return obj

    def matches(self, rt: ResourceType, stored: JsonObj, namespace: str, query: ListQuery) -> bool:
        srt = self.storage_type(rt)
        meta = stored.get("metadata", {})
        if namespace and meta.get("namespace") != namespace:
            return False
        return query.labels.matches(meta.get("labels")) and query.fields.matches(stored, srt.field_getters)

    def list(self, rt: ResourceType, namespace: str, query: ListQuery) -> JsonObj:
        """A list body. A resourceVersion newer than the store is the HTTP layer's to wait for."""
        if query.continue_token:
            list_rv, start = _decode_continue(query.continue_token)
            try:
                objects = self.store.snapshot_at(rt.storage_key, list_rv)
            except TooOld as exc:
                raise errors.expired(errors.CONTINUE_TOO_OLD) from exc
        elif query.resource_version_match == "Exact" and query.resource_version not in ("", "0"):
            list_rv, start = parse_resource_version(query.resource_version), ""
            try:
                objects = self.store.snapshot_at(rt.storage_key, list_rv)
            except TooOld as exc:
                raise errors.expired(errors.LIST_TOO_OLD) from exc
        else:
            list_rv, start = self.store.rv, ""
            objects = self.store.list(rt.storage_key)

        selected = [o for o in objects if self.matches(rt, o, namespace, query) and _key_str(o) > start]
        metadata: JsonObj = {"resourceVersion": str(list_rv)}
        if query.limit and len(selected) > query.limit:
            page = selected[: query.limit]
            metadata["continue"] = _encode_continue(list_rv, _key_str(page[-1]))
            if not query.labels.requirements and not query.fields.terms:
                metadata["remainingItemCount"] = len(selected) - len(page)
            selected = page
        return {
            "kind": rt.list_kind,
            "apiVersion": rt.api_version,
            "metadata": metadata,
            "items": [self.list_item(rt, o) for o in selected],
        }


def parse_resource_version(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise errors.bad_request(
            f'invalid resource version "{text}": must be a non-negative integer'
        ) from exc
    if value < 0:
        raise errors.bad_request(f'invalid resource version "{text}": must be a non-negative integer')
    return value


def _key_str(obj: JsonObj) -> str:
    namespace, name = object_key(obj)
    return f"{namespace}/{name}"


def _encode_continue(rv: int, last_key: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": last_key + "\x00"}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return int(raw["rv"]), str(raw["start"]).rstrip("\x00")
    except (ValueError, KeyError, TypeError) as exc:
        raise errors.bad_request(f"continue key is not valid: {exc}") from exc
