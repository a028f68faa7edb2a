"""Certificates for the extender's mutual TLS: a CA, the allocator's server certificate and
kube-scheduler's client certificate. Used by `topoalloc certs`, the tests and the benchmark.

Keys are ECDSA P-256: Go's TLS stack and OpenSSL both speak it, and a key takes microseconds to
generate, so tests can mint fresh certificates per case.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# kube-scheduler's client identity as recorded on the wire (wire README fact 10).
SCHEDULER_CLIENT_CN = "kube-scheduler-extender-client"
SCHEDULER_CLIENT_ORG = "system:kube-scheduler"
CA_CN = "topoalloc-extender-ca"


@dataclass(frozen=True)
class Issued:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def write(self, cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str]) -> None:
        """Write the PEM files; the key is created 0600 and both are replaced atomically."""
        _atomic_write(Path(cert_path), self.cert_pem, 0o644)
        _atomic_write(Path(key_path), self.key_pem, 0o600)

    @classmethod
    def load(cls, cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str]) -> Issued:
        """A certificate and its key from PEM files; CertError unless the key is the certificate's."""
        cert = load_certificate(cert_path)
        key = load_private_key(key_path)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise CertError("private key", str(key_path), "only ECDSA (P-256) keys are supported")
        if not keys_match(cert, key):
            raise CertError(
                "private key",
                str(key_path),
                f"does not belong to the certificate {cert_path} (public keys differ)",
            )
        return cls(cert, key)

    @classmethod
    def load_ca(cls, cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str]) -> Issued:
        """A CA to issue from: the pair must match, and the certificate must be a CA that may sign
        certificates and still be valid; otherwise what it signs verifies nowhere."""
        ca = cls.load(cert_path, key_path)
        where = str(cert_path)
        try:
            constraints = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        except x509.ExtensionNotFound:
            raise CertError("CA certificate", where, "has no basicConstraints extension: not a CA") from None
        if not constraints.ca:
            raise CertError("CA certificate", where, "basicConstraints says CA:FALSE: a leaf, not a CA")
        try:
            usage = ca.cert.extensions.get_extension_for_class(x509.KeyUsage).value
        except x509.ExtensionNotFound:
            usage = None  # RFC 5280 allows a CA without keyUsage: any use
        if usage is not None and not usage.key_cert_sign:
            raise CertError(
                "CA certificate", where, "keyUsage lacks keyCertSign: it may not sign certificates"
            )
        if ca.cert.not_valid_after_utc <= _now():
            raise CertError("CA certificate", where, f"expired on {ca.cert.not_valid_after_utc:%Y-%m-%d}")
        return ca


class CertError(ValueError):
    """A certificate or key that cannot be used: `<what> (<where>): <why>`."""

    def __init__(self, what: str, where: str, why: str) -> None:
        self.what, self.where, self.why = what, where, why
        super().__init__(f"{what} ({where}): {why}")


def _read(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CertError(what, str(path), f"cannot read: {exc.strerror or exc}") from None


def load_certificate(path: str | os.PathLike[str], what: str = "certificate") -> x509.Certificate:
    data = _read(path, what)
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        raise CertError(
            what, str(path), "not a PEM certificate (expected -----BEGIN CERTIFICATE-----)"
        ) from None


def load_private_key(path: str | os.PathLike[str]) -> serialization.PrivateKeyTypes:
    data = _read(path, "private key")
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise CertError("private key", str(path), "is encrypted; give an unencrypted key") from None
    except (ValueError, UnsupportedAlgorithm):
        raise CertError("private key", str(path), "not a PEM private key") from None


def keys_match(cert: x509.Certificate, key: serialization.PrivateKeyTypes) -> bool:
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    return cert.public_key().public_bytes(serialization.Encoding.DER, spki) == key.public_key().public_bytes(
        serialization.Encoding.DER, spki
    )


def check_serving_files(cert_path: str, key_path: str, ca_path: str) -> None:
    """What the extender needs before it listens: a certificate and the key that belongs to it,
    and a CA bundle to verify clients with. CertError names the file and the problem."""
    cert, key = load_certificate(cert_path, "TLS certificate"), load_private_key(key_path)
    if not keys_match(cert, key):
        raise CertError(
            "TLS key", key_path, f"does not belong to the certificate {cert_path} (public keys differ)"
        )
    load_certificate(ca_path, "client CA bundle")


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = []
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def make_ca(
    common_name: str = CA_CN,
    *,
    days: int = 3650,
    not_before: dt.datetime | None = None,
) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or _now() - dt.timedelta(minutes=5)
    name = _name(common_name)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def issue(
    ca: Issued,
    common_name: str,
    *,
    organization: str | None = None,
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str] = (),
    uris: Iterable[str] = (),
    server: bool = False,
    client: bool = False,
    days: int = 365,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> Issued:
    """A leaf certificate signed by `ca` for server and/or client authentication."""
    if not (server or client):
        raise ValueError("a certificate must be for server or client use (or both)")
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or _now() - dt.timedelta(minutes=5)
    end = not_after or start + dt.timedelta(days=days)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    sans += [x509.UniformResourceIdentifier(u) for u in uris]
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organization))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def service_dns_names(service: str, namespace: str, cluster_domain: str = "cluster.local") -> list[str]:
    """The names a client may use to reach a Service, shortest first."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{cluster_domain}",
    ]


def server_cert(
    ca: Issued,
    service: str,
    namespace: str,
    *,
    cluster_domain: str = "cluster.local",
    extra_dns: Iterable[str] = (),
    ip_addresses: Iterable[str] = (),
    days: int = 365,
    common_name: str = "",
) -> Issued:
    """The allocator's serving certificate. Its CN is `common_name`, by default the Service's
    `<service>.<namespace>.svc` (clients verify the SANs; the CN is what people read)."""
    dns = service_dns_names(service, namespace, cluster_domain) + list(extra_dns)
    cn = common_name or f"{service}.{namespace}.svc"
    return issue(ca, cn, dns_names=dns, ip_addresses=ip_addresses, server=True, days=days)


def scheduler_client_cert(
    ca: Issued,
    *,
    common_name: str = SCHEDULER_CLIENT_CN,
    organization: str | None = SCHEDULER_CLIENT_ORG,
    days: int = 365,
) -> Issued:
    return issue(ca, common_name, organization=organization, client=True, days=days)


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Digital signatures, plus certificate and CRL signing for a CA (nothing else: ECDSA keys)."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )
