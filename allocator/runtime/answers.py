"""What the API server answered: `ApiError` for a request it refused (or never answered), and for
a write, `Written` (the object as written) or `Refused` (the Status reason and status, said once by
the client: `KubeApi.patch`, `create`, `create_or_replace`). A `Refused` is falsy, so a caller
that only needs to know whether the write went through tests the result itself."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NoReturn

JSON = dict[str, Any]


class ApiError(Exception):
    """A non-2xx answer of the API server (or a transport failure, status 0)."""

    def __init__(self, status: int, reason: str = "", message: str = "", body: Any = None) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body
        super().__init__(f"{status} {reason}: {message}" if reason or message else f"HTTP {status}")

    @property
    def gone(self) -> bool:
        return self.status == 410

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @classmethod
    def from_body(cls, status: int, raw: bytes) -> ApiError:
        try:
            body = json.loads(raw)
        except ValueError:
            return cls(status, "", raw[:200].decode(errors="replace"), None)
        if isinstance(body, dict):
            return cls(status, str(body.get("reason", "")), str(body.get("message", "")), body)
        return cls(status, "", str(body)[:200], body)


# The Status reason kube-apiserver gives each refusal, for an answer that carries none.
_REASONS = {
    0: "Transport",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass(frozen=True)
class Written:
    """The API server took the write; `object` is what it answered (the object as written)."""

    object: JSON

    def __bool__(self) -> bool:
        return True

    @property
    def resource_version(self) -> str:
        return str((self.object.get("metadata") or {}).get("resourceVersion") or "")

    def or_raise(self) -> Written:
        return self


@dataclass(frozen=True)
class Refused:
    """The API server refused the write (or never answered: status 0). `reason` is the Status
    reason (NotFound, Conflict, AlreadyExists, Invalid, TooManyRequests, ...)."""

    reason: str
    status: int
    message: str = ""
    error: ApiError | None = field(default=None, compare=False, repr=False)

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return str(self.error if self.error is not None else ApiError(self.status, self.reason, self.message))

    @classmethod
    def of(cls, exc: ApiError) -> Refused:
        return cls(exc.reason or _REASONS.get(exc.status, ""), exc.status, exc.message, exc)

    def or_raise(self) -> NoReturn:
        """For a caller whose refusals are exceptions (the claims controller, the installer)."""
        raise self.error if self.error is not None else ApiError(self.status, self.reason, self.message)


Result = Written | Refused
