"""A throw-away PKI for a test control plane, made with the project's own certificate code."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from allocator.runtime import certs


@dataclass
class Pki:
    """A throw-away CA and the certificates it signs (`allocator.runtime.certs`, the project's own
    PKI code), as files in `dir`."""

    dir: Path
    ca: certs.Issued = field(init=False)

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca = certs.make_ca("topoalloc-test-cluster-ca")
        self.ca_file.write_bytes(self.ca.cert_pem)

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.crt"

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
