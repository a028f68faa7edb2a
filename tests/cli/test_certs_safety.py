"""`topoalloc certs` refuses a CA it cannot safely issue from, writes kubernetes.io/tls Secrets
and names its certificates on purpose (issue 18, "Unsafe certs")."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from allocator.runtime import certs as pki
from tests.cli.conftest import Ran

Run = Callable[..., Ran]


def _cn(path: Path) -> str:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value  # type: ignore[return-value]


def test_a_ca_key_that_does_not_match_is_refused(topoalloc: Run, tmp_path: Path) -> None:
    first, second = pki.make_ca(), pki.make_ca()
    first.write(tmp_path / "ca.crt", tmp_path / "ca.key")
    second.write(tmp_path / "other.crt", tmp_path / "other.key")
    ran = topoalloc(
        "certs", "--out", tmp_path / "o", "--ca-cert", tmp_path / "ca.crt", "--ca-key", tmp_path / "other.key"
    )
    assert ran.code == 2 and ran.clean_error
    assert f"private key ({tmp_path / 'other.key'}): does not belong to the certificate" in ran.stderr
    assert not (tmp_path / "o").exists()


def test_a_leaf_or_a_ca_that_may_not_sign_is_refused(topoalloc: Run, tmp_path: Path) -> None:
    ca = pki.make_ca()
    leaf = pki.issue(ca, "leaf", server=True)
    leaf.write(tmp_path / "leaf.crt", tmp_path / "leaf.key")
    ran = topoalloc(
        "certs",
        "--out",
        tmp_path / "o",
        "--ca-cert",
        tmp_path / "leaf.crt",
        "--ca-key",
        tmp_path / "leaf.key",
    )
    assert ran.code == 2 and ran.clean_error and "CA:FALSE" in ran.stderr

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "no-sign")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(pki._key_usage(signs_certificates=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    pki.Issued(cert, key).write(tmp_path / "nosign.crt", tmp_path / "nosign.key")
    ran = topoalloc(
        "certs",
        "--out",
        tmp_path / "o",
        "--ca-cert",
        tmp_path / "nosign.crt",
        "--ca-key",
        tmp_path / "nosign.key",
    )
    assert ran.code == 2 and ran.clean_error and "keyCertSign" in ran.stderr


def test_reusing_a_good_ca_still_works(topoalloc: Run, tmp_path: Path) -> None:
    pki.make_ca().write(tmp_path / "ca.crt", tmp_path / "ca.key")
    ran = topoalloc(
        "certs", "--out", tmp_path / "o", "--ca-cert", tmp_path / "ca.crt", "--ca-key", tmp_path / "ca.key"
    )
    assert ran.code == 0, ran
    assert "(reused)" in ran.stdout


def test_secrets_are_kubernetes_tls_with_the_ca_and_cns_are_explicit(topoalloc: Run, tmp_path: Path) -> None:
    out, secrets = tmp_path / "o", tmp_path / "secrets.yaml"
    ran = topoalloc("certs", "--out", out, "--secrets-yaml", secrets, "--dns", "allocator.example.com")
    assert ran.code == 0, ran
    docs = list(yaml.safe_load_all(secrets.read_text()))
    assert [d["type"] for d in docs] == ["kubernetes.io/tls", "kubernetes.io/tls"]
    for doc in docs:
        assert set(doc["data"]) == {"tls.crt", "tls.key", "ca.crt"}
        assert base64.b64decode(doc["data"]["ca.crt"]) == (out / "ca.crt").read_bytes()
    # The server CN is the Service's name, never one of the extra DNS names.
    assert _cn(out / "tls.crt") == "topoalloc-allocator.topoalloc-system.svc"
    assert _cn(out / "client.crt") == pki.SCHEDULER_CLIENT_CN
    assert _cn(out / "ca.crt") == pki.CA_CN
    again = topoalloc(
        "certs",
        "--out",
        out,
        "--force",
        "--server-cn",
        "alloc.internal",
        "--client-cn",
        "sched",
        "--ca-cn",
        "my-ca",
    )
    assert again.code == 0, again
    assert (_cn(out / "tls.crt"), _cn(out / "client.crt"), _cn(out / "ca.crt")) == (
        "alloc.internal",
        "sched",
        "my-ca",
    )


def test_bad_dns_name_is_a_usage_error(topoalloc: Run, tmp_path: Path) -> None:
    ran = topoalloc("certs", "--out", tmp_path / "o", "--dns", "Not A Name")
    assert ran.code == 2 and ran.clean_error and "is not a DNS name" in ran.stderr
