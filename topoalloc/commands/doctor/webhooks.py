"""The admission webhooks: the configuration the install mode calls for, a caBundle that is the CA of
the allocator's TLS Secret (kube-apiserver verifies the allocator's certificate against it), a
certificate that is valid for the webhook Service, kube-apiserver actually getting answers (a
server-side dry run of a pod each webhook selects: nothing is stored), and what each selects."""

from __future__ import annotations

import base64
import binascii
import datetime as dt

from cryptography import x509

from allocator.runtime.admission_settings import LEADER_SERVICE
from topoalloc.commands.doctor.facts import (
    ALLOCATOR,
    JSON,
    NAMESPACE,
    SERVER_SECRET,
    WEBHOOK_CONFIGURATION,
    Facts,
    Probe,
)
from topoalloc.commands.doctor.findings import Finding, fail, ok, warn

# What an entry's rules name, as a creation is spoken of ("pod creations").
_OBJECT = {
    "pods": "pod",
    "resourceclaims": "ResourceClaim",
    "resourceclaimtemplates": "ResourceClaimTemplate",
}
CHECK = "webhooks"
WEBHOOK_SERVICE = "topoalloc-webhook"
# The placement entry calls the leader alone, through the extender's Service (its webhook port).
SERVICES = (WEBHOOK_SERVICE, LEADER_SERVICE)
RESTART = f"kubectl -n {NAMESPACE} rollout restart deployment/{ALLOCATOR}"


def _decoded(value: object) -> bytes:
    if not isinstance(value, str):
        return b""
    try:
        return base64.b64decode(value)
    except (binascii.Error, ValueError):
        return b""


def _service(hook: JSON) -> str:
    return str(((hook.get("clientConfig") or {}).get("service") or {}).get("name") or "")


def _ours(hooks: list[JSON]) -> list[JSON]:
    return [h for h in hooks if _service(h) in SERVICES]


def check_ca(facts: Facts, hooks: list[JSON]) -> list[Finding]:
    if "secrets" in facts.unreadable:
        return [
            warn(
                CHECK,
                f"Secret {NAMESPACE}/{SERVER_SECRET} not read: {facts.unreadable['secrets']}",
                "run doctor with rights to read Secrets in topoalloc-system to compare the CA",
            )
        ]
    secret = facts.secrets.get(SERVER_SECRET)
    data = (secret or {}).get("data") or {}
    ca, cert = _decoded(data.get("ca.crt")), _decoded(data.get("tls.crt"))
    if not ca or not cert:
        return [
            fail(
                CHECK,
                f"Secret {NAMESPACE}/{SERVER_SECRET} is missing or lacks ca.crt or tls.crt: the allocator "
                "has "
                "no certificate to serve the webhooks with",
                "topoalloc install --rotate-certs (or, with --certs cert-manager, check its Certificate)",
            )
        ]
    out = []
    stale = [
        str(h.get("name"))
        for h in _ours(hooks)
        if _decoded((h.get("clientConfig") or {}).get("caBundle")).strip() != ca.strip()
    ]
    if stale:
        out.append(
            fail(
                CHECK,
                f"the caBundle of {len(stale)} webhook(s) is not the CA in Secret "
                f"{NAMESPACE}/{SERVER_SECRET} "
                "(the CA was rotated, the bundle not): kube-apiserver refuses the allocator's certificate "
                "once "
                "it serves the Secret's",
                f"the leader writes the Secret's ca.crt into the caBundle once it runs with it: {RESTART}; "
                "or topoalloc install --rotate-certs to issue both anew",
                [f"stale caBundle: {name}" for name in stale],
            )
        )
    services = sorted({_service(h) for h in _ours(hooks)}, key=SERVICES.index) or [WEBHOOK_SERVICE]
    problem = certificate_problem(cert, ca, facts.now, services)
    if problem:
        out.append(
            fail(CHECK, f"Secret {NAMESPACE}/{SERVER_SECRET}: {problem}", "topoalloc install --rotate-certs")
        )
    if not out:
        out.append(
            ok(
                CHECK,
                f"caBundle of {len(_ours(hooks))} webhook(s) = the CA of Secret {NAMESPACE}/{SERVER_SECRET}, "
                f"whose certificate is valid for Service(s) {', '.join(services)}",
            )
        )
    return out


def certificate_problem(
    cert_pem: bytes, ca_pem: bytes, now: float, services: list[str] | tuple[str, ...] = SERVICES
) -> str:
    """Why the allocator's certificate cannot serve the webhooks' `services` ("" when it can)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
        cert.verify_directly_issued_by(ca)
    except Exception as exc:
        return f"tls.crt is not a certificate issued by ca.crt ({exc or type(exc).__name__})"
    moment = dt.datetime.fromtimestamp(now, dt.UTC)
    if cert.not_valid_after_utc < moment:
        return f"its certificate expired {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
    if cert.not_valid_before_utc > moment:
        return f"its certificate is valid only from {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = sans.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        names = []
    for service in services:
        wanted = f"{service}.{NAMESPACE}.svc"
        if wanted not in names:
            return f"its certificate does not name {wanted} (it names {', '.join(names) or 'nothing'})"
    return ""


def check_probe(probe: Probe) -> Finding:
    if probe.refused:
        if probe.webhook in probe.refused:
            return fail(
                CHECK,
                f"kube-apiserver gets no answer from {probe.webhook}: {probe.refused}",
                f"the allocator's pods must be ready and the caBundle right (above); {RESTART}",
            )
        return warn(
            CHECK,
            f"the probe for {probe.webhook} was refused: {probe.refused}",
            "create a test pod in that namespace by hand to see why",
        )
    spec = (probe.admitted or {}).get("spec") or {}
    gates = [g.get("name") for g in spec.get("schedulingGates") or []]
    answered = probe.wanted in gates if probe.wanted != "affinity" else bool(spec.get("affinity"))
    if not answered:
        return fail(
            CHECK,
            f"{probe.webhook} did not answer kube-apiserver (it fails open: the pod was admitted without "
            f"{probe.wanted})",
            "the allocator's pods must be ready and reachable through Services "
            f"{NAMESPACE}/{WEBHOOK_SERVICE} and, for the placement entry, the leader's "
            f"{NAMESPACE}/{LEADER_SERVICE}; {RESTART}",
        )
    return ok(CHECK, f"{probe.webhook} answers kube-apiserver (a dry-run pod got {probe.wanted})")


def describe(hook: JSON) -> str:
    """Which pods a webhook is sent, in words."""
    parts = []
    for sel, what in ((hook.get("objectSelector"), "pods"), (hook.get("namespaceSelector"), "namespaces")):
        for e in (sel or {}).get("matchExpressions") or []:
            key, op, values = e.get("key"), e.get("operator"), ", ".join(e.get("values") or [])
            if key == "kubernetes.io/metadata.name" and op == "NotIn":
                parts.append(f"outside {values}")
            elif op == "Exists":
                parts.append(f"{what} labelled {key}")
            elif op == "NotIn":
                parts.append(f"{what} not labelled {key}={values}")
            else:
                parts.append(f"{what} with {key} {op} [{values}]")
        for key, value in ((sel or {}).get("matchLabels") or {}).items():
            parts.append(f"{what} labelled {key}={value}")
    conditions = [str(c.get("name")) for c in hook.get("matchConditions") or []]
    if conditions:
        parts.append("when " + " and ".join(conditions))
    policy = hook.get("failurePolicy", "Fail")
    resources = sorted({r for rule in hook.get("rules") or [] for r in rule.get("resources") or []})
    created = ", ".join(_OBJECT.get(r, r) for r in resources or ["pods"])
    return f"{hook.get('name')} ({policy}, {hook.get('timeoutSeconds', 10)} s): {created} creations" + (
        ", " + "; ".join(parts) if parts else ", every one"
    )


def check(facts: Facts) -> list[Finding]:
    if "webhooks" in facts.unreadable:
        return [
            warn(
                CHECK,
                f"{WEBHOOK_CONFIGURATION} not read: {facts.unreadable['webhooks']}",
                "run doctor with rights to read mutatingwebhookconfigurations",
            )
        ]
    if facts.webhooks is None:
        return [
            fail(
                CHECK,
                f"no MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION}: pods are not gated at admission "
                "(gang members bind in part; in placement mode GPU pods bind by count)",
                "topoalloc install",
            )
        ]
    hooks = list(facts.webhooks.get("webhooks") or [])
    out = [
        ok(
            CHECK,
            f"{WEBHOOK_CONFIGURATION}: {len(hooks)} webhook(s), each sent only the pods it acts on",
            [describe(h) for h in hooks],
        )
    ]
    out += check_ca(facts, hooks)
    if facts.probe_note:
        out.append(
            warn(
                CHECK,
                f"not probed: {facts.probe_note}",
                "kube-apiserver's own view needs a dry-run pod create",
            )
        )
    out += [check_probe(p) for p in facts.probes]
    return out
