"""Loading the kube-apiserver traffic recorded in ../shared/wire/apiserver/ and replaying it over HTTP."""

from __future__ import annotations

import http.client
import json
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from tests.apis.paths import APISERVER_WIRE as WIRE_DIR

VOLATILE_METADATA = ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "managedFields")


@dataclass(frozen=True)
class Recording:
    name: str
    method: str
    path: str
    request_headers: dict[str, str]
    request_body: bytes | None
    status: int
    response_headers: list[tuple[str, str]]
    response_body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.response_headers if k.lower() == name.lower()), None)

    def json(self) -> Any:
        return json.loads(self.response_body)


def load(name: str) -> Recording:
    if not WIRE_DIR.is_dir():
        raise FileNotFoundError(f"recorded apiserver traffic not found at {WIRE_DIR} (../shared must exist)")
    meta = json.loads((WIRE_DIR / f"{name}.headers.json").read_text())
    request_body = WIRE_DIR / f"{name}.request.json"
    response_body = WIRE_DIR / f"{name}.response.json"
    return Recording(
        name=name,
        method=meta["request"]["method"],
        path=meta["request"]["path"],
        request_headers=meta["request"]["headers"],
        request_body=request_body.read_bytes() if request_body.exists() else None,
        status=meta["status"],
        response_headers=[(k, v) for k, v in meta["response_headers"]],
        response_body=response_body.read_bytes() if response_body.exists() else b"",
    )


def stream_lines(name: str) -> list[bytes]:
    return (WIRE_DIR / f"{name}.stream.jsonl").read_bytes().splitlines(keepends=True)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def send(base_url: str, method: str, path: str, headers: dict[str, str], body: bytes | None) -> Answer:
    """One request over a fresh connection with http.client, as the recording script sent it."""
    url = urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        conn.close()


def replay(base_url: str, rec: Recording, *, path: str | None = None, body: bytes | None = None) -> Answer:
    return send(base_url, rec.method, path or rec.path, rec.request_headers, body or rec.request_body)


@dataclass
class WatchReader:
    """Reads a watch stream line by line on a background thread until the server ends it."""

    base_url: str
    path: str
    lines: list[bytes] = field(default_factory=list)
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def start(self) -> WatchReader:
        self._thread.start()
        if not self._started.wait(10):
            raise TimeoutError(f"watch {self.path} did not answer")
        return self

    def join(self, timeout: float = 10) -> list[bytes]:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"watch {self.path} did not end")
        return self.lines

    def _read(self) -> None:
        url = urlsplit(self.base_url)
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
        try:
            conn.request("GET", self.path, headers={"Accept": "application/json"})
            response = conn.getresponse()
            self.status = response.status
            self.headers = {k.lower(): v for k, v in response.getheaders()}
            self._started.set()
            while line := response.readline():
                self.lines.append(line)
        finally:
            self._started.set()
            conn.close()


def normalise(value: Any) -> Any:
    """Drop what naturally differs between two servers: uids, resourceVersions, server timestamps,
    managedFields (the fake does not track field managers)."""
    if isinstance(value, list):
        return [normalise(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if key == "metadata" and isinstance(item, dict):
            out[key] = {k: normalise(v) for k, v in item.items() if k not in VOLATILE_METADATA}
        elif key == "lastTransitionTime" and item != "2026-01-01T00:00:00Z":
            out[key] = "<server time>"  # set by the server when it wrote the condition
        else:
            out[key] = normalise(item)
    return out


def ordered(value: Any) -> str:
    """A JSON rendering that keeps key order, for comparing documents order and all."""
    return json.dumps(value, separators=(",", ":"))
