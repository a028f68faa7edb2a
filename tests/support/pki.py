"""The tests' one throw-away PKI, made with the project's own certificate code
(`allocator.runtime.certs`): a CA; the allocator's serving certificate for 127.0.0.1 and
kube-scheduler's client certificate (the extender's mutual TLS), with client SSL contexts; and the
leaves and signing keys a test control plane needs. All of it as files in `dir`."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from allocator.runtime import certs
from allocator.runtime.tls import TLSFiles


@dataclass
class ClientFiles:
    cert: Path
    key: Path


@dataclass
class Pki:
    """A CA in `dir` (ca.crt, ca.key), the allocator's server files (tls.crt, tls.key and its
    client-CA bundle client-ca.crt, its own file so tests can rotate it on its own) and
    kube-scheduler's client files (client.crt, client.key)."""

    dir: Path
    ca: certs.Issued = field(init=False)
    server: TLSFiles = field(init=False)
    client: ClientFiles = field(init=False)

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca = certs.make_ca("topoalloc-test-ca")
        self.ca.write(self.ca_file, self.dir / "ca.key")
        server = certs.server_cert(
            self.ca,
            "topoalloc-allocator",
            "topoalloc-system",
            extra_dns=["localhost"],
            ip_addresses=["127.0.0.1"],
        )
        server.write(self.dir / "tls.crt", self.dir / "tls.key")
        (self.dir / "client-ca.crt").write_bytes(self.ca.cert_pem)
        self.server = TLSFiles(self.dir / "tls.crt", self.dir / "tls.key", self.dir / "client-ca.crt")
        self.client = self.client_files(certs.scheduler_client_cert(self.ca), "client")

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.crt"

    def client_files(self, issued: certs.Issued, name: str) -> ClientFiles:
        files = ClientFiles(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        issued.write(files.cert, files.key)
        return files

    def client_context(self, client: ClientFiles | None = None, *, with_cert: bool = True) -> ssl.SSLContext:
        """What kube-scheduler does: verify the server against the CA, present its certificate."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(self.ca_file))
        if with_cert:
            c = client or self.client
            ctx.load_cert_chain(str(c.cert), str(c.key))
        return ctx

    def issue(
        self,
        name: str,
        common_name: str,
        *,
        organization: str | None = None,
        dns_names: tuple[str, ...] = (),
        ip_addresses: tuple[str, ...] = (),
    ) -> tuple[Path, Path]:
        """A leaf for clients (no names) or servers; returns (cert file, key file)."""
        server = bool(dns_names or ip_addresses)
        leaf = certs.issue(
            self.ca,
            common_name,
            organization=organization,
            dns_names=dns_names,
            ip_addresses=ip_addresses,
            server=server,
            client=not server,
        )
        cert_file, key_file = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        leaf.write(cert_file, key_file)
        return cert_file, key_file

    def signing_key(self, name: str) -> tuple[Path, Path]:
        """A bare key pair (service-account token signing): (public key file, private key file)."""
        key = ec.generate_private_key(ec.SECP256R1())
        pub_file, key_file = self.dir / f"{name}.pub", self.dir / f"{name}.key"
        pub_file.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        return pub_file, key_file
