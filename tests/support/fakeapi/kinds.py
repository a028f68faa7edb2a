"""Namespace and Event rules (pods have their own module)."""

from __future__ import annotations

from typing import Any

from .behaviour import KindBehaviour
from .errors import FieldError
from .objects import reorder

JsonObj = dict[str, Any]

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


class NamespaceBehaviour(KindBehaviour):
    """Namespaces carry the `kubernetes` finalizer, an Active phase and their automatic name label."""

    returns_deleted_object = True
    dns_label_names = True

    def prepare_create(self, obj: JsonObj, now: str) -> None:
        meta = obj["metadata"]
        meta["labels"] = {**(meta.get("labels") or {}), NAMESPACE_NAME_LABEL: meta["name"]}
        obj["spec"] = {"finalizers": ["kubernetes"], **(obj.get("spec") or {})}
        obj["status"] = {"phase": "Active"}

    def prepare_update(self, old: JsonObj, new: JsonObj, now: str) -> None:
        meta = new["metadata"]
        meta["labels"] = {**(meta.get("labels") or {}), NAMESPACE_NAME_LABEL: meta["name"]}


# core/v1 Event <-> events.k8s.io/v1 Event: the apiserver stores one object and shows it in both shapes.
_CORE_TO_V1 = {
    "eventTime": "eventTime",
    "series": "series",
    "reportingComponent": "reportingController",
    "reportingInstance": "reportingInstance",
    "action": "action",
    "reason": "reason",
    "involvedObject": "regarding",
    "related": "related",
    "message": "note",
    "type": "type",
    "source": "deprecatedSource",
    "firstTimestamp": "deprecatedFirstTimestamp",
    "lastTimestamp": "deprecatedLastTimestamp",
    "count": "deprecatedCount",
}
_V1_TO_CORE = {v: k for k, v in _CORE_TO_V1.items()}
CORE_EVENT_ORDER = (
    "kind", "apiVersion", "metadata", "involvedObject", "reason", "message", "source", "firstTimestamp",
    "lastTimestamp", "count", "type", "eventTime", "series", "action", "related", "reportingComponent",
    "reportingInstance",
)  # fmt: skip
V1_EVENT_ORDER = ("kind", "apiVersion", "metadata", *(_CORE_TO_V1[k] for k in CORE_EVENT_ORDER[3:]))


def normalise_core_event(event: JsonObj) -> JsonObj:
    """Fields Go always writes for a core Event, present even when nobody set them."""
    defaults: JsonObj = {
        "involvedObject": {},
        "source": {},
        "firstTimestamp": None,
        "lastTimestamp": None,
        "eventTime": None,
        "reportingComponent": "",
        "reportingInstance": "",
    }
    return reorder({**defaults, **event}, CORE_EVENT_ORDER)


def core_event_to_v1(event: JsonObj) -> JsonObj:
    out: JsonObj = {}
    for key, value in event.items():
        if key in ("kind", "apiVersion"):
            continue
        out[_CORE_TO_V1.get(key, key)] = value
    for empty in ("reportingController", "reportingInstance", "note", "reason", "type", "action"):
        if out.get(empty) == "":
            del out[empty]
    if out.get("deprecatedCount") == 0:
        del out["deprecatedCount"]
    return reorder(out, V1_EVENT_ORDER)


def v1_event_to_core(event: JsonObj) -> JsonObj:
    out = {_V1_TO_CORE.get(k, k): v for k, v in event.items() if k not in ("kind", "apiVersion")}
    return normalise_core_event(out)


class CoreEventBehaviour(KindBehaviour):
    def prepare_create(self, obj: JsonObj, now: str) -> None:
        obj.update(normalise_core_event(obj))

    def prepare_update(self, old: JsonObj, new: JsonObj, now: str) -> None:
        new.update(normalise_core_event(new))


class EventsV1Behaviour(KindBehaviour):
    """events.k8s.io/v1 requires what the core API leaves optional (checked on the v1 shape)."""

    def validate_create(self, obj: JsonObj) -> list[FieldError]:
        errs: list[FieldError] = []
        if not obj.get("eventTime"):
            errs.append(FieldError("Required", "eventTime"))
        if obj.get("type") not in ("Normal", "Warning"):
            errs.append(FieldError("Invalid", "type", f"has invalid value: {obj.get('type', '')}", ""))
        for required in ("reportingController", "reportingInstance", "action", "reason"):
            if not obj.get(required):
                errs.append(FieldError("Required", required))
        if len(obj.get("note") or "") > 1024:
            errs.append(FieldError("Invalid", "note", "can have at most 1024 characters", ""))
        return errs
