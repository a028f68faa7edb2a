"""`topoalloc certs`: the files it writes form a working mTLS setup for the allocator."""

from __future__ import annotations

import base64
import ssl
import stat
from pathlib import Path

import yaml
from click.testing import CliRunner
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from allocator.runtime.tls import TLSFiles, build_server_context
from topoalloc.cli import main
from topoalloc.commands.certs import CLIENT_SECRET, SERVER_SECRET


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_generates_ca_server_and_client(tmp_path: Path) -> None:
    out = tmp_path / "pki"
    secrets = tmp_path / "secrets.yaml"
    result = CliRunner().invoke(
        main, ["certs", "--out-dir", str(out), "--ip", "127.0.0.1", "--secrets-yaml", str(secrets)]
    )
    assert result.exit_code == 0, result.output
    ca, server, client = load(out / "ca.crt"), load(out / "tls.crt"), load(out / "client.crt")
    for leaf in (server, client):
        leaf.verify_directly_issued_by(ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "topoalloc-allocator.topoalloc-system.svc" in sans.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    eku = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert (
        client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        == "kube-scheduler-extender-client"
    )
    for key in ("ca.key", "tls.key", "client.key"):
        assert stat.S_IMODE((out / key).stat().st_mode) == 0o600
    # The allocator loads them, and a client context with the scheduler's files verifies it.
    build_server_context(TLSFiles(out / "tls.crt", out / "tls.key", out / "ca.crt"))
    ssl.create_default_context(cafile=str(out / "ca.crt")).load_cert_chain(
        out / "client.crt", out / "client.key"
    )
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(secrets.read_text())}
    assert base64.b64decode(docs[SERVER_SECRET]["data"]["tls.crt"]) == (out / "tls.crt").read_bytes()
    assert base64.b64decode(docs[CLIENT_SECRET]["data"]["ca.crt"]) == (out / "ca.crt").read_bytes()


def test_refuses_to_overwrite_and_reuses_a_ca(tmp_path: Path) -> None:
    out = tmp_path / "pki"
    runner = CliRunner()
    assert runner.invoke(main, ["certs", "--out-dir", str(out)]).exit_code == 0
    again = runner.invoke(main, ["certs", "--out-dir", str(out)])
    assert again.exit_code != 0 and "already exist" in again.output
    ca_before = (out / "ca.crt").read_bytes()
    old_server = load(out / "tls.crt").serial_number
    rotated = runner.invoke(
        main,
        [
            "certs",
            "--out-dir",
            str(out),
            "--ca-cert",
            str(out / "ca.crt"),
            "--ca-key",
            str(out / "ca.key"),
            "--force",
        ],
    )
    assert rotated.exit_code == 0, rotated.output
    assert (out / "ca.crt").read_bytes() == ca_before
    assert load(out / "tls.crt").serial_number != old_server
    load(out / "tls.crt").verify_directly_issued_by(load(out / "ca.crt"))
