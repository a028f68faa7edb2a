"""The generic registry: create, read, update, patch, delete and bind, with the apiserver's rules.

Everything here is synchronous and runs on the server's event loop; the HTTP layer parses requests into
calls on `Operations` and renders what comes back (or the `ApiError` raised).
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import errors, pods
from .errors import FieldError, GoValue
from .objects import (
    SERVER_MANAGED,
    canonical_metadata,
    generated_name,
    new_uid,
    timestamp,
    validate_generate_name,
    validate_name,
)
from .patching import apply_patch
from .resources import Registry, ResourceType
from .selectors import FieldSelector, LabelSelector
from .store import Store, TooOld, object_key

JsonObj = dict[str, Any]

BINDING_TYPE_NAME = "Binding"


@dataclass(frozen=True)
class DeleteOptions:
    grace_period: int | None = None
    uid: str | None = None  # preconditions.uid
    resource_version: str | None = None  # preconditions.resourceVersion


@dataclass(frozen=True)
class ListQuery:
    labels: LabelSelector = field(default_factory=LabelSelector)
    fields: FieldSelector = field(default_factory=FieldSelector)
    resource_version: str = ""
    resource_version_match: str = ""
    limit: int = 0
    continue_token: str = ""


class Operations:
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

    # -- create --------------------------------------------------------------------------------------
    def create(self, rt: ResourceType, namespace: str, body: Any) -> JsonObj:
        srt = self.storage_type(rt)
        obj = self._checked_body(rt, body)
        meta = obj["metadata"]
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise errors.ApiError(
                500,
                "InternalError",
                "resourceVersion should not be set on objects to be created",
                {},
            )
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = generated_name(str(meta["generateName"]))
        name = meta.get("name") or ""
        # As kube-apiserver: the prefix first, then the (generated) name, both in one 422.
        name_errors = []
        if meta.get("generateName"):
            name_errors += validate_generate_name(meta["generateName"], label=srt.behaviour.dns_label_names)
        name_errors += validate_name(name, label=srt.behaviour.dns_label_names)
        if name_errors:
            raise errors.invalid(rt, name, name_errors)
        if rt.view is not None:
            self._raise_invalid(rt, name, rt.behaviour.validate_create(obj))
        if rt.namespaced:
            self._check_namespace_open(rt, namespace, name)
        if self.store.get(rt.storage_key, namespace if rt.namespaced else "", name) is not None:
            raise errors.already_exists(rt, name)

        stored = self._to_storage(rt, obj)
        smeta = stored["metadata"]
        for field_name in SERVER_MANAGED:
            smeta.pop(field_name, None)
        now = timestamp()
        smeta["uid"] = new_uid()
        smeta["creationTimestamp"] = now
        if srt.tracks_generation:
            smeta["generation"] = 1
        if srt.custom and srt.status_subresource:
            stored.pop("status", None)  # status is written through /status only
        srt.behaviour.prepare_create(stored, now)
        self._raise_invalid(rt, name, srt.behaviour.validate_create(stored))
        srt.behaviour.canonicalise(stored)
        stored["metadata"] = canonical_metadata(stored["metadata"])
        return self.present(rt, self.store.add(srt.key, stored))

    def _check_namespace_open(self, rt: ResourceType, namespace: str, name: str) -> None:
        if not self.require_namespaces:
            return
        ns = self.store.get("namespaces", "", namespace)
        if ns is None:
            raise errors.not_found(self.types.resolve("namespaces"), namespace)
        if ns["metadata"].get("deletionTimestamp"):
            raise errors.forbidden(
                rt,
                name,
                f"unable to create new content in namespace {namespace} because it is being terminated",
            )

    # -- update / patch ------------------------------------------------------------------------------
    def replace(
        self, rt: ResourceType, namespace: str, name: str, body: Any, subresource: str = ""
    ) -> JsonObj:
        """PUT. Returns the stored object; creates when the kind allows create-on-update."""
        if (
            self.store.get(rt.storage_key, namespace, name) is None
            and rt.allow_create_on_update
            and not subresource
        ):
            obj = self._checked_body(rt, body)
            if obj["metadata"].get("name") not in (None, "", name):
                raise errors.bad_request(_name_mismatch(obj["metadata"]["name"], name))
            obj["metadata"]["name"] = name
            obj["metadata"].pop("resourceVersion", None)
            return self.create(rt, namespace, obj)
        return self._update(rt, namespace, name, lambda _current: body, subresource, is_put=True)

    def patch(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        content_type: str,
        raw: bytes,
        subresource: str = "",
    ) -> JsonObj:
        return self._update(
            rt,
            namespace,
            name,
            lambda current: apply_patch(rt, content_type, current, raw),
            subresource,
            is_put=False,
        )

    def _update(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        make: Callable[[JsonObj], Any],
        subresource: str,
        *,
        is_put: bool,
    ) -> JsonObj:
        srt = self.storage_type(rt)
        old = self._stored(rt, namespace, name)
        candidate = self._checked_body(rt, make(copy.deepcopy(self.present(rt, old))))
        meta = candidate["metadata"]
        if meta.get("name") not in (None, "", name):
            raise errors.bad_request(_name_mismatch(meta["name"], name))
        if rt.namespaced and meta.get("namespace") not in (None, "", namespace):
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        old_meta = old["metadata"]
        if meta.get("resourceVersion"):
            if meta["resourceVersion"] != old_meta["resourceVersion"]:
                raise errors.conflict(rt, name, errors.MODIFIED_CONFLICT)
        elif is_put and srt.custom:
            # Worded as the generic registry words it: the "kind" is the resource, the value Go's 0x0.
            unversioned = FieldError(
                "Invalid", "metadata.resourceVersion", "must be specified for an update", GoValue("0x0")
            )
            raise errors.invalid(rt, name, [unversioned], kind=rt.plural)
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise errors.precondition_failed(srt, namespace, name, "UID", meta["uid"], old_meta["uid"])

        new = self._to_storage(rt, candidate)
        for field_name in (*SERVER_MANAGED, "name", "namespace"):
            if field_name in old_meta:
                new["metadata"][field_name] = old_meta[field_name]
            else:
                new["metadata"].pop(field_name, None)
        now = timestamp()
        if subresource == "status":
            new = (
                {**copy.deepcopy(old), "status": new["status"]}
                if "status" in new
                else _without(old, "status")
            )
        else:
            if srt.status_subresource:
                new = {**new, "status": old["status"]} if "status" in old else _without(new, "status")
            srt.behaviour.prepare_update(old, new, now)
            errs = _finalizer_errors(old_meta, new["metadata"]) + srt.behaviour.validate_update(old, new)
            self._raise_invalid(rt, name, errs)
        if srt.tracks_generation and _spec_view(srt, old) != _spec_view(srt, new):
            new["metadata"]["generation"] = int(old_meta.get("generation") or 0) + 1
        srt.behaviour.canonicalise(new)
        new["metadata"] = canonical_metadata(new["metadata"])
        if _deletes_on_update(old, new):
            # The last finalizer is gone: the object is deleted rather than written (one DELETED event
            # carrying its last stored state), and the client gets back the object it sent.
            self._remove(srt, old)
            return self.present(rt, new)
        if new == old:
            return self.present(rt, old)  # a no-op write stores nothing and emits no event
        return self.present(rt, self.store.replace(srt.key, new))

    # -- delete --------------------------------------------------------------------------------------
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

    # -- binding -------------------------------------------------------------------------------------
    def bind(self, namespace: str, name: str, body: Any) -> JsonObj:
        pods_rt = self.types.resolve("pods")
        binding_rt = _binding_type(pods_rt)
        if not isinstance(body, dict):
            raise errors.bad_request("the body of a Binding must be a JSON object")
        bmeta = body.get("metadata") or {}
        if bmeta.get("name") not in (None, "", name):
            raise errors.bad_request("name in URL does not match name in Binding object")
        target = body.get("target") or {}
        if not target.get("name"):
            raise errors.invalid(binding_rt, name, [FieldError("Required", "target.name")])
        pod = self._stored(pods_rt, namespace, name)
        if bmeta.get("uid") and bmeta["uid"] != pod["metadata"]["uid"]:
            raise errors.precondition_failed(
                pods_rt, namespace, name, "UID", bmeta["uid"], pod["metadata"]["uid"]
            )
        refusal = pods.binding_refusal(pod)
        if refusal:
            raise errors.conflict(pods_rt, name, refusal, subresource="binding")
        self.store.replace(
            pods_rt.key, pods.bound(pod, target["name"], bmeta.get("annotations") or {}, timestamp())
        )
        return errors.success_status(code=201)

    # -- eviction ------------------------------------------------------------------------------------
    def evict(self, namespace: str, name: str, body: Any) -> JsonObj:
        """policy/v1 Eviction: refused with 429 while a PodDisruptionBudget selecting the pod allows
        no disruption (`status.disruptionsAllowed`, written by kube-controller-manager's disruption
        controller: a budget without status allows none); otherwise the budget's allowance drops by
        one and the pod is deleted as a DELETE would (a bound pod stays Terminating)."""
        pods_rt = self.types.resolve("pods")
        if not isinstance(body, dict):
            raise errors.bad_request("the body of an Eviction must be a JSON object")
        if (body.get("metadata") or {}).get("name") not in (None, "", name):
            raise errors.bad_request("name in URL does not match name in Eviction object")
        pod = self._stored(pods_rt, namespace, name)
        labels = pod["metadata"].get("labels") or {}
        pdb_rt = self.types.resolve("poddisruptionbudgets")
        budgets = [
            b
            for b in self.store.list(pdb_rt.storage_key, namespace)
            if _selects((b.get("spec") or {}).get("selector"), labels)
        ]
        if len(budgets) > 1:
            raise errors.ApiError(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            )
        if budgets and not pod["metadata"].get("deletionTimestamp"):
            budget = budgets[0]
            allowed = int((budget.get("status") or {}).get("disruptionsAllowed") or 0)
            if allowed < 1:
                raise errors.ApiError(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    {
                        "causes": [
                            {
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget {budget['metadata']['name']} needs more healthy pods",
                            }
                        ]
                    },
                )
            budget = copy.deepcopy(budget)
            budget.setdefault("status", {})["disruptionsAllowed"] = allowed - 1
            self.store.replace(pdb_rt.key, budget)
        grace = (body.get("deleteOptions") or {}).get("gracePeriodSeconds")
        self._delete_stored(self.storage_type(pods_rt), pod, grace)
        return errors.success_status(code=201)

    # -- helpers -------------------------------------------------------------------------------------
    def _checked_body(self, rt: ResourceType, body: Any) -> JsonObj:
        if not isinstance(body, dict):
            raise errors.bad_request(
                f"the body of the request must be a JSON object, not {type(body).__name__}"
            )
        obj = copy.deepcopy(body)
        if obj.get("apiVersion") not in (None, "", rt.api_version):
            raise errors.bad_request(
                f"the API version in the data ({obj['apiVersion']}) does not match the expected API version "
                f"({rt.api_version})"
            )
        if obj.get("kind") not in (None, "", rt.kind):
            raise errors.bad_request(
                f"the kind in the data ({obj['kind']}) does not match the expected kind ({rt.kind})"
            )
        if not isinstance(obj.get("metadata") or {}, dict):
            raise errors.bad_request("metadata must be a JSON object")
        obj["metadata"] = obj.get("metadata") or {}
        return rt.stamp(obj)

    @staticmethod
    def _raise_invalid(rt: ResourceType, name: str, errs: list[FieldError]) -> None:
        if errs:
            raise errors.invalid(rt, name, errs)


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


def _deleted_status(rt: ResourceType, final: JsonObj) -> JsonObj:
    """What a DELETE answers for kinds that do not return the object: a Success Status naming it."""
    details: JsonObj = {"name": final["metadata"]["name"]}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.plural
    details["uid"] = final["metadata"]["uid"]
    return errors.success_status(details=details)


def _name_mismatch(body_name: str, url_name: str) -> str:
    return f"the name of the object ({body_name}) does not match the name on the URL ({url_name})"


def _without(obj: JsonObj, key: str) -> JsonObj:
    return {k: v for k, v in obj.items() if k != key}


def _spec_view(rt: ResourceType, obj: JsonObj) -> JsonObj:
    """What `metadata.generation` tracks: everything but metadata (and status, given a subresource)."""
    skip = ("metadata", "status") if rt.status_subresource else ("metadata",)
    return {k: v for k, v in obj.items() if k not in skip}


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


def _deletes_on_update(old: JsonObj, new: JsonObj) -> bool:
    """An update that leaves no finalizer on an object being deleted (no grace period running) deletes it."""
    meta = old["metadata"]
    return (
        bool(meta.get("deletionTimestamp"))
        and not new["metadata"].get("finalizers")
        and not meta.get("deletionGracePeriodSeconds")
    )


def _finalizer_errors(old_meta: JsonObj, new_meta: JsonObj) -> list[FieldError]:
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


def _binding_type(pods_rt: ResourceType) -> ResourceType:
    """Bindings only appear in error messages (`Binding "w1" is invalid: ...`)."""
    return ResourceType(
        group="", version="v1", plural="bindings", kind=BINDING_TYPE_NAME, namespaced=True,
        behaviour=pods_rt.behaviour, status_subresource=False,
    )  # fmt: skip


def _selects(selector: Any, labels: JsonObj) -> bool:
    """A LabelSelector (matchLabels, matchExpressions) against pod labels; null selects nothing."""
    if not isinstance(selector, dict):
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if (op == "In" and labels.get(key) not in values) or (
            op == "NotIn" and present and labels[key] in values
        ):
            return False
        if (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True
