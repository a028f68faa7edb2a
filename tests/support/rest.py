"""A small JSON client for kube-apiserver (test set-up and checks) and the kubeconfig files the
product's processes are handed."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import urllib3
import yaml


class ApiStatus(Exception):
    """An HTTP error answer of the API server, with its Status body."""

    def __init__(self, status: int, body: Any, method: str, path: str) -> None:
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{method} {path}: {status} {message}")

    @property
    def message(self) -> str:
        return str(self.body.get("message", "")) if isinstance(self.body, dict) else str(self.body)


class Rest:
    """A small JSON client for the API server, for test set-up and checks (the product code under
    test uses its own clients)."""

    def __init__(
        self,
        url: str,
        ca_file: Path | None = None,
        cert: tuple[Path, Path] | None = None,
        *,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """`ca_file` verifies an https `url`; without it the URL is plain http (the fake API server)."""
        self.url = url
        self.headers = dict(headers or {})
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        tls: dict[str, Any] = {}
        if ca_file is not None:
            tls = {
                "ca_certs": str(ca_file),
                "cert_file": str(cert[0]) if cert else None,
                "key_file": str(cert[1]) if cert else None,
                "cert_reqs": "CERT_REQUIRED",
            }
        self.pool = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=5, read=30), **tls)

    def impersonating(
        self, user: str, *, groups: tuple[str, ...] = (), extra: Mapping[str, str] = {}
    ) -> Rest:
        """The same credentials acting as `user` (Impersonate-* headers; needs the impersonate verb)."""
        clone = object.__new__(Rest)
        clone.url, clone.pool = self.url, self.pool
        clone.headers = dict(self.headers)
        clone.headers["Impersonate-User"] = user
        # urllib3 takes one value per header name; the API server accepts groups comma-free only
        # as repeated headers, so several groups are not supported here.
        if groups:
            assert len(groups) == 1, "one impersonated group at a time"
            clone.headers["Impersonate-Group"] = groups[0]
        for key, value in extra.items():
            clone.headers[f"Impersonate-Extra-{_escape_extra(key)}"] = value
        return clone

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        url = self.url + path
        if query:
            url += "?" + urlencode(query)
        resp = self.pool.request(
            method,
            url,
            body=data,
            headers=headers,
            timeout=urllib3.Timeout(connect=5, read=timeout) if timeout else None,
        )
        try:
            parsed: Any = json.loads(resp.data) if resp.data else None
        except ValueError:
            parsed = resp.data.decode(errors="replace")
        if resp.status >= 400:
            raise ApiStatus(resp.status, parsed, method, path)
        return parsed

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query or None)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body)

    def merge_patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, **query: Any) -> Any:
        return self.request("DELETE", path, query=query or None)


def _escape_extra(key: str) -> str:
    """Impersonate-Extra-* header names percent-encode what a header name cannot hold."""
    return "".join(c if c.isalnum() or c in "-_.~!#$&'*+^`|" else f"%{ord(c):02X}" for c in key)


def kubeconfig_text(
    url: str, ca_file: Path | None = None, *, cert: tuple[Path, Path] | None = None, token: str | None = None
) -> str:
    """A kubeconfig for `url` (plain HTTP, such as the fake API server's, without `ca_file`)."""
    user: dict[str, str] = {}
    if cert:
        user = {"client-certificate": str(cert[0]), "client-key": str(cert[1])}
    if token:
        user["token"] = token
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": url} | ({"certificate-authority": str(ca_file)} if ca_file else {}),
            }
        ],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
        "current-context": "local",
    }
    return yaml.safe_dump(doc, sort_keys=False)
