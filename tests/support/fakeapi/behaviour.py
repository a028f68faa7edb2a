"""Per-kind rules (defaulting, validation, deletion) that the generic registry calls into."""

from __future__ import annotations

from typing import Any

from .errors import FieldError

JsonObj = dict[str, Any]


class KindBehaviour:
    """The generic behaviour: no defaults, no validation beyond metadata, immediate deletion."""

    # Deleting answers with the deleted object rather than a `Status` (pods do this).
    returns_deleted_object = False
    # Deletion sets deletionTimestamp first and may wait out a grace period (pods).
    graceful_deletion = False
    # Names must be RFC 1123 labels (namespaces) rather than subdomains (everything else).
    dns_label_names = False

    def prepare_create(self, obj: JsonObj, now: str) -> None:
        """Fill the defaults and admission-time fields of a new object (mutates `obj`)."""

    def validate_create(self, obj: JsonObj) -> list[FieldError]:
        return []

    def prepare_update(self, old: JsonObj, new: JsonObj, now: str) -> None:
        """Adjust a main-resource update before validation (mutates `new`)."""

    def validate_update(self, old: JsonObj, new: JsonObj) -> list[FieldError]:
        return []

    def canonicalise(self, obj: JsonObj) -> None:
        """Bring a written object into the shape a round trip through the Go type gives it: field order,
        and fields Go always writes (such as a null `lastProbeTime`). Mutates `obj`."""

    def grace_period(self, obj: JsonObj, requested: int | None) -> int:
        """Seconds the object lingers with a deletionTimestamp before removal (0: remove now)."""
        return 0


DEFAULT_BEHAVIOUR = KindBehaviour()
