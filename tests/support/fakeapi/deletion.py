"""The generic registry's deletes: graceful deletion (pods), finalizers, collections, and the namespace
controller's part (a terminating namespace empties, then goes), done inline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import errors
from .errors import FieldError
from .objects import canonical_metadata, timestamp
from .reads import ListQuery, ReadOperations
from .resources import ResourceType
from .store import object_key

JsonObj = dict[str, Any]


@dataclass(frozen=True)
class DeleteOptions:
    grace_period: int | None = None
    uid: str | None = None  # preconditions.uid
    resource_version: str | None = None  # preconditions.resourceVersion


class DeleteOperations(ReadOperations):
    """DELETE of one object or a collection, and the removal an update that drops the last finalizer
    leads to (`_remove`)."""

    def delete(self, rt: ResourceType, namespace: str, name: str, options: DeleteOptions) -> JsonObj:
        """DELETE. Returns the response body: the object (pods, pending finalizers) or a Status."""
        srt = self.storage_type(rt)
        current = self._stored(rt, namespace, name)
        meta = current["metadata"]
        if options.uid and options.uid != meta["uid"]:
            raise errors.precondition_failed(srt, namespace, name, "UID", options.uid, meta["uid"])
        if options.resource_version and options.resource_version != meta["resourceVersion"]:
            raise errors.precondition_failed(
                srt, namespace, name, "ResourceVersion", options.resource_version, meta["resourceVersion"]
            )
        if srt.key == "namespaces":
            return self.present(rt, self._delete_namespace(current))
        final, removed = self._delete_stored(srt, current, options.grace_period)
        if removed and not srt.behaviour.returns_deleted_object:
            return _deleted_status(rt, final)
        return self.present(rt, final)

    def _delete_stored(
        self, srt: ResourceType, current: JsonObj, requested_grace: int | None
    ) -> tuple[JsonObj, bool]:
        """Mark or remove one stored object: (its last state, whether it is gone). Kinds with graceful
        deletion (pods) first record their deletionTimestamp (a MODIFIED), as the apiserver does."""
        meta = current["metadata"]
        finalizers = bool(meta.get("finalizers"))
        if srt.behaviour.graceful_deletion:
            grace = self._grace(srt, current, requested_grace)
            if grace is None:  # graceful deletion already pending and not shortened
                return current, False
            if grace != meta.get("deletionGracePeriodSeconds") or not meta.get("deletionTimestamp"):
                current = self.store.replace(srt.key, _marked_deleting(current, grace))
            if grace > 0 or finalizers:
                return current, False
            return self._remove(srt, current), True
        if finalizers:
            if not meta.get("deletionTimestamp"):
                current = self.store.replace(srt.key, _marked_deleting(current, 0))
            return current, False
        return self._remove(srt, current), True

    def _grace(self, srt: ResourceType, current: JsonObj, requested: int | None) -> int | None:
        meta = current["metadata"]
        if not meta.get("deletionTimestamp"):
            return srt.behaviour.grace_period(current, requested)
        pending = meta.get("deletionGracePeriodSeconds")
        if not pending:
            return 0
        if requested is None or requested >= pending:
            return None
        return max(requested, 0)

    def _remove(self, srt: ResourceType, stored: JsonObj) -> JsonObj:
        namespace, name = object_key(stored)
        final = self.store.remove(srt.key, namespace, name)
        if namespace:
            self._finish_namespace_if_empty(namespace)
        return final

    def delete_collection(
        self, rt: ResourceType, namespace: str, query: ListQuery, options: DeleteOptions
    ) -> JsonObj:
        srt = self.storage_type(rt)
        deleted = [
            self._delete_stored(srt, stored, options.grace_period)[0]
            for stored in self.store.list(rt.storage_key)
            if self.matches(rt, stored, namespace, query)
        ]
        return {
            "kind": rt.list_kind,
            "apiVersion": rt.api_version,
            "metadata": {"resourceVersion": str(self.store.rv)},
            "items": [self.list_item(rt, o) for o in deleted],
        }

    # -- namespaces: the namespace controller's part, done inline ------------------------------------
    def _delete_namespace(self, ns: JsonObj) -> JsonObj:
        name = ns["metadata"]["name"]
        if not ns["metadata"].get("deletionTimestamp"):
            terminating = _marked_deleting(ns, 0)
            terminating["status"] = {**(terminating.get("status") or {}), "phase": "Terminating"}
            ns = self.store.replace("namespaces", terminating)
        for storage in self.store.storages_with_namespace(name):
            srt = self.types.resolve(storage)
            for stored in self.store.list(storage, name):
                self._delete_stored(srt, stored, 0)
        return self._finish_namespace_if_empty(name) or self.store.get("namespaces", "", name) or ns

    def _finish_namespace_if_empty(self, namespace: str) -> JsonObj | None:
        """Remove a terminating namespace once nothing is left in it; returns its final state."""
        ns = self.store.get("namespaces", "", namespace)
        if ns is None or not ns["metadata"].get("deletionTimestamp") or ns["metadata"].get("finalizers"):
            return None
        if self.store.count_in_namespace(namespace):
            return None
        return self.store.remove("namespaces", "", namespace)


def _deleted_status(rt: ResourceType, final: JsonObj) -> JsonObj:
    """What a DELETE answers for kinds that do not return the object: a Success Status naming it."""
    details: JsonObj = {"name": final["metadata"]["name"]}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.plural
    details["uid"] = final["metadata"]["uid"]
    return errors.success_status(details=details)


def _marked_deleting(obj: JsonObj, grace: int) -> JsonObj:
    """The object with its deletion recorded. Like the apiserver, the first mark bumps a tracked
    generation, and an existing deletionTimestamp only ever moves earlier."""
    meta = dict(obj["metadata"])
    if not meta.get("deletionTimestamp") and meta.get("generation"):
        meta["generation"] += 1
    deadline = timestamp(grace)
    if not meta.get("deletionTimestamp") or meta["deletionTimestamp"] > deadline:
        meta["deletionTimestamp"] = deadline
    meta["deletionGracePeriodSeconds"] = grace
    return {**obj, "metadata": canonical_metadata(meta)}


def deletes_on_update(old: JsonObj, new: JsonObj) -> bool:
    """An update that leaves no finalizer on an object being deleted (no grace period running) deletes it."""
    meta = old["metadata"]
    return (
        bool(meta.get("deletionTimestamp"))
        and not new["metadata"].get("finalizers")
        and not meta.get("deletionGracePeriodSeconds")
    )


def finalizer_errors(old_meta: JsonObj, new_meta: JsonObj) -> list[FieldError]:
    if not old_meta.get("deletionTimestamp"):
        return []
    added = [f for f in new_meta.get("finalizers") or [] if f not in (old_meta.get("finalizers") or [])]
    if not added:
        return []
    listed = ", ".join(f'"{f}"' for f in added)
    return [
        FieldError(
            "Forbidden",
            "metadata.finalizers",
            "no new finalizers can be added if the object is being deleted, "
            f"found new finalizers []string{{{listed}}}",
        )
    ]
