"""Mutual TLS for the extender port: contexts, hot reload and the client allowlist.

Reload works by handing the listening socket an *outer* context whose `sni_callback` switches each
new handshake to the current inner context (the callback also runs when the client sends no SNI,
as kube-scheduler does for IP URLs). Swapping the inner context replaces certificate, key and CA
store at once; established keep-alive connections keep the context they were accepted with, so
no request is dropped.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TLSFiles:
    cert: Path  # the allocator's server certificate (chain)
    key: Path
    client_ca: Path  # CA bundle that client certificates must chain to

    def paths(self) -> tuple[Path, Path, Path]:
        return (self.cert, self.key, self.client_ca)


def build_server_context(files: TLSFiles, *, client_certs: bool = True) -> ssl.SSLContext:
    """The extender's mutual-TLS context; `client_certs=False` serves the same certificate to
    clients that present none (the API server calling the admission webhook)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(files.cert), str(files.key))
    if client_certs:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=str(files.client_ca))
    # kube-scheduler offers h2 and http/1.1; aiohttp's server speaks HTTP/1.1 only.
    ctx.set_alpn_protocols(["http/1.1"])
    # No session resumption: every connection presents and verifies its certificate, so a CA
    # rotation cannot be bypassed with an old ticket. kube-scheduler keeps one connection alive,
    # so full handshakes cost nothing measurable.
    ctx.num_tickets = 0
    ctx.options |= ssl.OP_NO_TICKET
    return ctx


def _fingerprint(files: TLSFiles) -> str:
    digest = hashlib.sha256()
    for path in files.paths():
        digest.update(path.read_bytes())  # follows the Secret volume's ..data symlink
        digest.update(b"\0")
    return digest.hexdigest()


class ReloadingTLS:
    """A server SSL context whose certificate, key and client CA follow their files."""

    def __init__(
        self, files: TLSFiles, on_reload: Callable[[bool], None] | None = None, *, client_certs: bool = True
    ) -> None:
        self.files = files
        self._on_reload = on_reload
        self._client_certs = client_certs
        self._fingerprint = _fingerprint(files)
        self._current = build_server_context(files, client_certs=client_certs)
        self.context = build_server_context(files, client_certs=client_certs)
        self.context.sni_callback = self._select
        self.generation = 1
        self.last_error: str | None = None
        self._failed_fingerprint: str | None = None

    def _select(self, sslobj: ssl.SSLObject, server_name: str | None, _outer: ssl.SSLContext) -> None:
        sslobj.context = self._current

    def reload_if_changed(self) -> bool:
        """Swap in a new context when the files changed and form a valid set; True if swapped.

        A half-written rotation (new cert, old key) fails to load; the old context stays in
        service and the load is retried on the next change."""
        try:
            fingerprint = _fingerprint(self.files)
        except OSError as exc:
            self._fail(None, f"reading TLS files: {exc}")
            return False
        if fingerprint == self._fingerprint or fingerprint == self._failed_fingerprint:
            return False
        try:
            new = build_server_context(self.files, client_certs=self._client_certs)
        except (OSError, ssl.SSLError, ValueError) as exc:
            self._fail(fingerprint, f"loading TLS files: {exc}")
            return False
        self._current = new
        self._fingerprint = fingerprint
        self._failed_fingerprint = None
        self.last_error = None
        self.generation += 1
        log.info("TLS certificate, key and client CA reloaded (generation %d)", self.generation)
        if self._on_reload:
            self._on_reload(True)
        return True

    def _fail(self, fingerprint: str | None, message: str) -> None:
        if fingerprint is None or fingerprint != self._failed_fingerprint:
            log.warning("%s; keeping the previous certificate", message)
            if self._on_reload:
                self._on_reload(False)
        self._failed_fingerprint = fingerprint
        self.last_error = message

    async def watch(self, interval: float) -> None:
        """Poll the files (Secret volumes update by an atomic symlink swap, inotify is unreliable)."""
        while True:
            await asyncio.sleep(interval)
            self.reload_if_changed()


# -- client identity ----------------------------------------------------------------------------

_SAN_KINDS = {"DNS": "DNS", "URI": "URI", "IP ADDRESS": "IP", "EMAIL": "EMAIL"}


@dataclass(frozen=True)
class PeerIdentity:
    common_names: tuple[str, ...]
    organizations: tuple[str, ...]
    sans: tuple[tuple[str, str], ...]  # (DNS|URI|IP|EMAIL, value)

    def describe(self) -> str:
        parts = [f"O={o}" for o in self.organizations] + [f"CN={c}" for c in self.common_names]
        parts += [f"{k}:{v}" for k, v in self.sans]
        return ", ".join(parts) or "(empty subject)"


def peer_identity(peercert: dict[str, Any]) -> PeerIdentity:
    """From `SSLObject.getpeercert()` (a verified certificate)."""
    cns: list[str] = []
    orgs: list[str] = []
    for rdn in peercert.get("subject", ()):
        for attr, value in rdn:
            if attr == "commonName":
                cns.append(value)
            elif attr == "organizationName":
                orgs.append(value)
    sans = tuple(
        (_SAN_KINDS[kind.upper()], value)
        for kind, value in peercert.get("subjectAltName", ())
        if kind.upper() in _SAN_KINDS
    )
    return PeerIdentity(tuple(cns), tuple(orgs), sans)


_SELECTORS = {"CN": "CN", "O": "O", "DNS": "DNS", "URI": "URI", "IP": "IP", "EMAIL": "EMAIL"}


class ClientAllowlist:
    """Which verified client certificates may call the extender.

    An entry `NAME` matches a certificate whose CN or any SAN equals NAME. `CN=x`, `O=x`, `DNS:x`,
    `URI:x`, `IP:x`, `EMAIL:x` (`=` or `:` after the selector) match only that field. An empty
    allowlist admits every certificate the CA verified."""

    def __init__(self, entries: Iterable[str] = ()) -> None:
        self.any_field: set[str] = set()
        self.by_field: set[tuple[str, str]] = set()
        for raw in entries:
            entry = raw.strip()
            if not entry:
                continue
            selector, value = self._split(entry)
            if selector is None:
                self.any_field.add(entry)
            else:
                self.by_field.add((selector, value))

    @staticmethod
    def _split(entry: str) -> tuple[str | None, str]:
        for sep in ("=", ":"):
            head, found, tail = entry.partition(sep)
            if found and head.strip().upper() in _SELECTORS and tail:
                return _SELECTORS[head.strip().upper()], tail.strip()
        return None, entry

    def __bool__(self) -> bool:
        return bool(self.any_field or self.by_field)

    def allows(self, who: PeerIdentity) -> bool:
        if not self:
            return True
        fields = [("CN", c) for c in who.common_names] + [("O", o) for o in who.organizations]
        fields += list(who.sans)
        if any(f in self.by_field for f in fields):
            return True
        return any(v in self.any_field for k, v in fields if k != "O")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def client_auth_middleware(
    allowlist: ClientAllowlist, on_reject: Callable[[str], None] | None = None
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """403 for a verified client certificate that the allowlist does not name."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        peercert = transport.get_extra_info("peercert") if transport is not None else None
        if not peercert:
            # CERT_REQUIRED makes this unreachable over TLS; refuse rather than trust a plain socket.
            reason = "no client certificate"
        else:
            who = peer_identity(peercert)
            if allowlist.allows(who):
                return await handler(request)
            reason = f"client certificate {who.describe()} is not allowed"
        if on_reject:
            on_reject(reason)
        log.warning("rejected %s %s: %s", request.method, request.path, reason)
        return web.Response(status=403, text=reason + "\n")

    return middleware
