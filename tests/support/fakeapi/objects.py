"""Helpers on raw API objects: timestamps, metadata order, name rules, JSON encoding."""

from __future__ import annotations

import json
import random
import re
import time
import uuid
from typing import Any

from apis.timestamps import format_time

from .errors import FieldError

JsonObj = dict[str, Any]

# ObjectMeta fields in the order Go serialises them.
METADATA_ORDER = (
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
)

# Fields the server owns: a client cannot set them through a create or an update.
SERVER_MANAGED = ("uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
                  "deletionGracePeriodSeconds", "selfLink")  # fmt: skip


def timestamp(offset_seconds: float = 0.0) -> str:
    """RFC 3339 in whole seconds, UTC, as the apiserver writes metav1.Time."""
    return format_time(time.time() + offset_seconds)


def new_uid() -> str:
    return str(uuid.uuid4())


_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


# apiserver's SimpleNameGenerator: the prefix is cut so that prefix + 5 random characters fit 63.
MAX_GENERATED_PREFIX = 58


def generated_name(prefix: str) -> str:
    return prefix[:MAX_GENERATED_PREFIX] + "".join(random.choices(_GENERATE_ALPHABET, k=5))


def reorder(obj: JsonObj, order: tuple[str, ...]) -> JsonObj:
    """`obj` with the keys in `order` first, in that order, then the rest as they were."""
    head = {k: obj[k] for k in order if k in obj}
    return {**head, **{k: v for k, v in obj.items() if k not in head}}


def canonical_metadata(meta: JsonObj) -> JsonObj:
    """ObjectMeta as Go writes it: its field order, map keys sorted, empty maps and lists left out."""
    meta = reorder(meta, METADATA_ORDER)
    for mapping in ("labels", "annotations"):
        if isinstance(meta.get(mapping), dict):
            meta[mapping] = dict(sorted(meta[mapping].items()))
    for omitted in ("labels", "annotations", "finalizers", "ownerReferences", "managedFields"):
        if omitted in meta and not meta[omitted]:
            del meta[omitted]
    return meta


def encode(obj: Any, *, sort_keys: bool = False) -> bytes:
    """Compact JSON with a trailing newline, the apiserver's framing."""
    return (json.dumps(obj, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys) + "\n").encode()


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)


def validate_generate_name(prefix: str, *, label: bool = False) -> list[FieldError]:
    """kube-apiserver checks `generateName` itself as a name prefix: the name rules, except that it
    may end in '-'. A prefix ending in '.' is refused with 422 even though the generated name
    would be valid (the real server's answer; this fake once accepted it)."""
    masked = prefix[:-1] + "a" if prefix.endswith("-") else prefix
    return [
        FieldError(e.type, "metadata.generateName", e.detail, prefix)
        for e in validate_name(masked, label=label)
        if e.type != "Required"
    ]


def validate_name(name: str, *, label: bool = False) -> list[FieldError]:
    """Name rules: RFC 1123 subdomain (most kinds) or label (namespaces)."""
    if not name:
        return [FieldError("Required", "metadata.name", "name or generateName is required")]
    errs: list[FieldError] = []
    if label:
        if len(name) > 63:
            errs.append(FieldError("Invalid", "metadata.name", "must be no more than 63 characters", name))
        if not _DNS_LABEL.match(name):
            errs.append(FieldError("Invalid", "metadata.name", _LABEL_MESSAGE, name))
    else:
        if len(name) > 253:
            errs.append(FieldError("Invalid", "metadata.name", "must be no more than 253 characters", name))
        if not _DNS_SUBDOMAIN.match(name):
            errs.append(FieldError("Invalid", "metadata.name", _SUBDOMAIN_MESSAGE, name))
    return errs
