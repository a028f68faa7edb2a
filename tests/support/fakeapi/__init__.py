"""A stateful fake Kubernetes API server for tests (aiohttp on 127.0.0.1).

It speaks the apiserver's REST protocol closely enough for the official `kubernetes` client (sync and
`kubernetes.aio`) to run unchanged against it, and its answers are checked against the real recorded
traffic in ../shared/wire/apiserver/. See docs/fake-apiserver.md for what it implements and how tests use it.
"""

from .errors import ApiError, FieldError
from .faults import Fault, RecordedRequest
from .resources import ResourceType
from .server import FakeApiServer, ServerThread

__all__ = [
    "ApiError",
    "FakeApiServer",
    "Fault",
    "FieldError",
    "RecordedRequest",
    "ResourceType",
    "ServerThread",
]
