"""The generic registry: create, read, update, patch, delete and bind, with the apiserver's rules.
Reads are in reads.py, deletes in deletion.py; `Operations` adds the writes on top of them.

Everything here is synchronous and runs on the server's event loop; the HTTP layer parses requests into
calls on `Operations` and renders what comes back (or the `ApiError` raised).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from . import errors, pods
from .deletion import DeleteOperations, deletes_on_update, finalizer_errors
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
from .resources import ResourceType

JsonObj = dict[str, Any]

BINDING_TYPE_NAME = "Binding"


class Operations(DeleteOperations):
    """Everything the HTTP layer calls: reads (`ReadOperations`), deletes (`DeleteOperations`), and
    here the writes (create, update, patch) and the pods' binding and eviction."""

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
            if not is_put:
                # A patch naming another uid: kube-apiserver takes it as a change of the uid, which
                # validation refuses (a PUT's uid is a precondition instead), twice: the registry's
                # check of the metadata and the kind's own (the message says it once).
                immutable = FieldError("Invalid", "metadata.uid", "field is immutable", meta["uid"])
                raise errors.invalid(rt, name, [immutable, immutable])
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
            errs = finalizer_errors(old_meta, new["metadata"]) + srt.behaviour.validate_update(old, new)
            self._raise_invalid(rt, name, errs)
        if srt.tracks_generation and _spec_view(srt, old) != _spec_view(srt, new):
            new["metadata"]["generation"] = int(old_meta.get("generation") or 0) + 1
        srt.behaviour.canonicalise(new)
        new["metadata"] = canonical_metadata(new["metadata"])
        if deletes_on_update(old, new):
            # The last finalizer is gone: the object is deleted rather than written (one DELETED event
            # carrying its last stored state), and the client gets back the object it sent.
            self._remove(srt, old)
            return self.present(rt, new)
        if new == old:
            return self.present(rt, old)  # a no-op write stores nothing and emits no event
        return self.present(rt, self.store.replace(srt.key, new))

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


def _name_mismatch(body_name: str, url_name: str) -> str:
    return f"the name of the object ({body_name}) does not match the name on the URL ({url_name})"


def _without(obj: JsonObj, key: str) -> JsonObj:
    return {k: v for k, v in obj.items() if k != key}


def _spec_view(rt: ResourceType, obj: JsonObj) -> JsonObj:
    """What `metadata.generation` tracks: everything but metadata (and status, given a subresource)."""
    skip = ("metadata", "status") if rt.status_subresource else ("metadata",)
    return {k: v for k, v in obj.items() if k not in skip}


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
