"""Test PKI: a CA, the allocator's server certificate for 127.0.0.1, kube-scheduler's client
certificate, written to real files and turned into client SSL contexts."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from allocator.runtime import certs
from allocator.runtime.tls import TLSFiles


@dataclass
class ClientFiles:
    cert: Path
    key: Path


@dataclass
class Pki:
    dir: Path
    ca: certs.Issued
    server: TLSFiles
    client: ClientFiles

    @classmethod
    def create(cls, directory: Path) -> Pki:
        directory.mkdir(parents=True, exist_ok=True)
        ca = certs.make_ca("test-extender-ca")
        ca.write(directory / "ca.crt", directory / "ca.key")
        server = certs.server_cert(
            ca, "topoalloc-allocator", "topoalloc-system", extra_dns=["localhost"], ip_addresses=["127.0.0.1"]
        )
        server.write(directory / "tls.crt", directory / "tls.key")
        client = certs.scheduler_client_cert(ca)
        client.write(directory / "client.crt", directory / "client.key")
        # The allocator's client-CA bundle is its own file, so tests can rotate it on its own.
        (directory / "client-ca.crt").write_bytes(ca.cert_pem)
        return cls(
            directory,
            ca,
            TLSFiles(directory / "tls.crt", directory / "tls.key", directory / "client-ca.crt"),
            ClientFiles(directory / "client.crt", directory / "client.key"),
        )

    def client_files(self, issued: certs.Issued, name: str) -> ClientFiles:
        files = ClientFiles(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        issued.write(files.cert, files.key)
        return files

    def client_context(self, client: ClientFiles | None = None, *, with_cert: bool = True) -> ssl.SSLContext:
        """What kube-scheduler does: verify the server against the CA, present its certificate."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(self.dir / "ca.crt"))
        if with_cert:
            c = client or self.client
            ctx.load_cert_chain(str(c.cert), str(c.key))
        return ctx
