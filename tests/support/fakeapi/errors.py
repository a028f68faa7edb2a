"""`kind: Status` error bodies, shaped and worded like kube-apiserver v1.32's.

The wording of every message that ../shared/wire/apiserver/ recorded is reproduced exactly; the others follow
the apiserver's own formats (`k8s.io/apimachinery/pkg/api/errors`) as closely as is known.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

JsonObj = dict[str, Any]


class NamedResource(Protocol):
    """What an error names of a resource type (`resources.ResourceType`, not imported: the resource
    types hold the per-kind behaviour, which raises these errors)."""

    @property
    def group(self) -> str: ...

    @property
    def plural(self) -> str: ...

    @property
    def kind(self) -> str: ...


@dataclass(frozen=True)
class FieldError:
    """One field validation failure, rendered like `field.Error` in apimachinery."""

    type: str  # Required | Invalid | Forbidden | NotSupported | Duplicate
    field: str
    detail: str = ""
    value: Any = None  # rendered as JSON, or verbatim when a GoValue

    @property
    def reason(self) -> str:
        return f"FieldValue{self.type}"

    @property
    def message(self) -> str:
        """The cause message, without the field path (as in `details.causes[].message`)."""
        head = {
            "Required": "Required value",
            "Forbidden": "Forbidden",
            "NotSupported": f"Unsupported value: {_render(self.value)}",
            "Duplicate": f"Duplicate value: {_render(self.value)}",
            "Invalid": f"Invalid value: {_render(self.value)}",
        }[self.type]
        return f"{head}: {self.detail}" if self.detail else head

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class GoValue(str):
    """A value already rendered the way Go's %#v renders it (`0x0`), shown verbatim in messages."""


def _render(value: Any) -> str:
    return str(value) if isinstance(value, GoValue) else json.dumps(value)


class ApiError(Exception):
    """An error answer: the HTTP status and a `Status` body."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: JsonObj | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> JsonObj:
        return status_body(self.code, self.reason, self.message, self.details)


def status_body(code: int, reason: str, message: str, details: JsonObj | None = None) -> JsonObj:
    body: JsonObj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def success_status(code: int | None = None, details: JsonObj | None = None) -> JsonObj:
    body: JsonObj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
    if details is not None:
        body["details"] = details
    if code is not None:
        body["code"] = code
    return body


@dataclass(frozen=True)
class _Names:
    """How one resource is named in messages and `details`."""

    qualified: str  # `pods`, `leases.coordination.k8s.io`
    details: JsonObj = field(default_factory=dict)


def _names(rt: NamedResource, name: str, kind: str | None = None) -> _Names:
    details: JsonObj = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = kind if kind is not None else rt.plural
    qualified = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
    return _Names(qualified, details)


def not_found(rt: NamedResource, name: str) -> ApiError:
    n = _names(rt, name)
    return ApiError(404, "NotFound", f'{n.qualified} "{name}" not found', n.details)


def already_exists(rt: NamedResource, name: str) -> ApiError:
    n = _names(rt, name)
    return ApiError(409, "AlreadyExists", f'{n.qualified} "{name}" already exists', n.details)


def conflict(rt: NamedResource, name: str, why: str, *, subresource: str = "") -> ApiError:
    """409 Conflict: `Operation cannot be fulfilled on <resource> "<name>": <why>`."""
    kind = f"{rt.plural}/{subresource}" if subresource else rt.plural
    n = _names(rt, name, kind)
    qualified = f"{n.qualified}/{subresource}" if subresource else n.qualified
    return ApiError(
        409, "Conflict", f'Operation cannot be fulfilled on {qualified} "{name}": {why}', n.details
    )


MODIFIED_CONFLICT = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def precondition_failed(
    rt: NamedResource, namespace: str, name: str, what: str, wanted: str, actual: str
) -> ApiError:
    """A UID or resourceVersion precondition mismatch, worded as the etcd storage layer words it."""
    key = "/".join(p for p in ("/registry", rt.group, rt.plural, namespace, name) if p)
    why = (
        f"StorageError: invalid object, Code: 4, Key: {key}, ResourceVersion: 0, AdditionalErrorMsg: "
        f"Precondition failed: {what} in precondition: {wanted}, {what} in object meta: {actual}"
    )
    return conflict(rt, name, why)


def invalid(rt: NamedResource, name: str, errors: list[FieldError], *, kind: str = "") -> ApiError:
    """422 Invalid, listing each field error (one bare, several in brackets, as apimachinery does).
    `kind` overrides the kind named in the message (the generic registry sometimes names the resource)."""
    kind = kind or rt.kind
    qualified = f"{kind}.{rt.group}" if rt.group else kind
    said = list(dict.fromkeys(str(e) for e in errors))  # the message says a repeated error once
    rendered = ", ".join(said)
    if len(said) > 1:
        rendered = f"[{rendered}]"
    details: JsonObj = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = kind
    details["causes"] = [{"reason": e.reason, "message": e.message, "field": e.field} for e in errors]
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {rendered}', details)


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


LIST_TOO_OLD = "The resourceVersion for the provided list is too old."
CONTINUE_TOO_OLD = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter."
)


def watch_too_old(requested: int, oldest: int) -> ApiError:
    return expired(f"too old resource version: {requested} ({oldest})")


def too_large_resource_version(requested: int, current: int) -> ApiError:
    details: JsonObj = {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }
    return ApiError(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {requested}, current: {current}",
        details,
        headers={"Retry-After": "1"},
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def forbidden(rt: NamedResource, name: str, why: str) -> ApiError:
    n = _names(rt, name)
    return ApiError(403, "Forbidden", f'{n.qualified} "{name}" is forbidden: {why}', n.details)


def path_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}
    )


def unsupported_media_type(accepted: list[str]) -> ApiError:
    message = "the body of the request was in an unknown format - accepted media types include: " + ", ".join(
        accepted
    )
    return ApiError(415, "UnsupportedMediaType", message, {})


# Default reason for a bare status code, used by fault injection.
REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
