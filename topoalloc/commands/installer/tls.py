"""The extender's PKI for `install --certs generate`: the same CA, serving certificate (the
allocator's and the gang webhook's Service names) and kube-scheduler client certificate as
`topoalloc certs`, kept only in the two kubernetes.io/tls Secrets the manifests mount. The CA's
private key is never stored: a rotation issues a new CA with new leaves.

Secrets already in the cluster are kept while they stay usable (a re-install or an upgrade must
not change the client certificate a self-managed kube-scheduler was given by hand).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from allocator.runtime import certs as pki
from allocator.runtime.admission_settings import WEBHOOK_SERVICE
from allocator.runtime.config import DEFAULT_NAMESPACE, DEFAULT_SERVICE
from topoalloc.commands.certs import CLIENT_SECRET, SERVER_SECRET

SECRETS = (SERVER_SECRET, CLIENT_SECRET)
#: A certificate closer to its end than this is issued again.
RENEW_BEFORE = dt.timedelta(days=30)

TlsFiles = dict[str, dict[str, bytes]]  # Secret name -> {tls.crt, tls.key, ca.crt}


def issue_secrets(namespace: str = DEFAULT_NAMESPACE, *, days: int = 365) -> TlsFiles:
    ca = pki.make_ca()
    webhook_dns = pki.service_dns_names(WEBHOOK_SERVICE, namespace)
    server = pki.server_cert(ca, DEFAULT_SERVICE, namespace, extra_dns=webhook_dns, days=days)
    client = pki.scheduler_client_cert(ca, days=days)
    return {
        SERVER_SECRET: {"tls.crt": server.cert_pem, "tls.key": server.key_pem, "ca.crt": ca.cert_pem},
        CLIENT_SECRET: {"tls.crt": client.cert_pem, "tls.key": client.key_pem, "ca.crt": ca.cert_pem},
    }


def unusable(existing: Mapping[str, Mapping[str, bytes]], namespace: str = DEFAULT_NAMESPACE) -> str | None:
    """Why the Secrets in the cluster cannot be kept (None: keep them)."""
    now = dt.datetime.now(dt.UTC)
    cas = set()
    for name in SECRETS:
        files = existing.get(name)
        if not files or not all(files.get(k) for k in ("tls.crt", "tls.key", "ca.crt")):
            return f"Secret {name} is missing or lacks tls.crt, tls.key or ca.crt"
        try:
            cert = x509.load_pem_x509_certificate(files["tls.crt"])
            ca = x509.load_pem_x509_certificate(files["ca.crt"])
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature) as exc:
            why = str(exc) or type(exc).__name__
            return f"Secret {name} holds no certificate issued by its ca.crt ({why})"
        if cert.not_valid_after_utc - now < RENEW_BEFORE:
            return f"Secret {name}'s certificate ends {cert.not_valid_after_utc:%Y-%m-%d}"
        cas.add(files["ca.crt"])
        if name == SERVER_SECRET:
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            wanted = pki.service_dns_names(DEFAULT_SERVICE, namespace)[2:3]
            wanted += pki.service_dns_names(WEBHOOK_SERVICE, namespace)[2:3]
            missing = set(wanted) - set(sans.get_values_for_type(x509.DNSName))
            if missing:
                return f"Secret {name}'s certificate lacks {', '.join(sorted(missing))}"
    if len(cas) != 1:
        return "the two Secrets hold different CAs"
    return None
