"""The webhook checks on constructed objects: the configuration and what each webhook is sent, in
words; a caBundle that is not the CA of the allocator's Secret (rotated without the bundle) fails
with the fix; a certificate that expired, was not issued by the Secret's CA or does not name the
webhook Service fails; the dry-run probes: refused by a webhook failing closed, or admitted without
the webhook's change (it failed open), fail."""

from __future__ import annotations

import base64

from allocator.runtime import certs as pki
from tests.doctor.healthy import NOW, facts, secret
from topoalloc.commands.doctor import webhooks
from topoalloc.commands.doctor.facts import Probe
from topoalloc.commands.doctor.findings import FAIL, OK, WARN
from topoalloc.commands.installer import tls


def statuses(found: list) -> list[str]:
    return [f.status for f in found]


def test_a_healthy_configuration_passes_and_says_what_each_webhook_selects() -> None:
    found = webhooks.check(facts())
    assert statuses(found) == [OK, OK, OK, OK]
    said = dict(d.split(" (", 1) for d in found[0].details)
    assert said["placement.topoalloc.io"] == (
        "Ignore, 2 s): pod creations, pods not labelled topoalloc.io/placement=false; outside kube-system, "
        "topoalloc-system; namespaces not labelled topoalloc.io/placement=false; when not-bound-at-creation "
        "and asks-for-a-managed-device"
    )
    assert said["podgroup.gang.topoalloc.io"].startswith(
        "Fail, 5 s): pod creations, pods labelled scheduling.x-k8s.io/pod-group"
    )
    assert said["claims.dra.topoalloc.io"].startswith("Ignore, 5 s): ResourceClaim creations, outside")
    assert said["claimtemplates.dra.topoalloc.io"].startswith("Ignore, 5 s): ResourceClaimTemplate creations")


def test_a_ca_rotated_without_the_bundle_fails_naming_the_webhooks_and_the_fix() -> None:
    f = facts()
    f.secrets["topoalloc-allocator-tls"] = secret(tls.issue_secrets("topoalloc-system")[tls.SECRETS[0]])
    found = webhooks.check_ca(f, f.webhooks["webhooks"])
    assert statuses(found) == [FAIL]
    assert "is not the CA in Secret topoalloc-system/topoalloc-allocator-tls" in found[0].what
    assert "rollout restart deployment/topoalloc-allocator" in found[0].fix
    assert len(found[0].details) == 10 and "stale caBundle: placement.topoalloc.io" in found[0].details


def test_a_missing_secret_fails_and_an_unreadable_one_warns() -> None:
    f = facts()
    f.secrets.clear()
    assert statuses(webhooks.check_ca(f, f.webhooks["webhooks"])) == [FAIL]
    f.unreadable["secrets"] = "HTTP 403: secrets is forbidden"
    [found] = webhooks.check_ca(f, f.webhooks["webhooks"])
    assert found.status == WARN and "HTTP 403" in found.what


def test_certificates_that_cannot_serve_the_webhooks_are_named() -> None:
    files = tls.issue_secrets("topoalloc-system")[tls.SECRETS[0]]
    now = NOW
    assert webhooks.certificate_problem(files["tls.crt"], files["ca.crt"], now) == ""
    expired = webhooks.certificate_problem(files["tls.crt"], files["ca.crt"], now + 400 * 86400)
    assert expired.startswith("its certificate expired")
    other_ca = pki.make_ca().cert_pem
    assert "not a certificate issued by ca.crt" in webhooks.certificate_problem(
        files["tls.crt"], other_ca, now
    )
    ca = pki.make_ca()
    narrow = pki.server_cert(ca, "topoalloc-allocator", "topoalloc-system")  # the extender's names only
    said = webhooks.certificate_problem(narrow.cert_pem, ca.cert_pem, NOW)
    assert said.startswith("its certificate does not name topoalloc-webhook.topoalloc-system.svc")


def test_an_expired_certificate_fails_the_check() -> None:
    f = facts()
    f.now = NOW + 400 * 86400
    found = webhooks.check_ca(f, f.webhooks["webhooks"])
    assert statuses(found) == [FAIL] and "expired" in found[0].what
    assert found[0].fix == "topoalloc install --rotate-certs"


def test_probes_refused_by_the_webhook_or_admitted_unchanged_fail() -> None:
    refused = Probe(
        "podgroup.gang.topoalloc.io",
        "topoalloc.io/gang",
        refused='Internal error occurred: failed calling webhook "podgroup.gang.topoalloc.io": failed to call '
        "webhook: x509: certificate signed by unknown authority",
    )
    found = webhooks.check_probe(refused)
    assert found.status == FAIL and "x509: certificate signed by unknown authority" in found.what
    unchanged = webhooks.check_probe(
        Probe("placement.topoalloc.io", "topoalloc.io/placement", admitted={"spec": {}})
    )
    assert unchanged.status == FAIL and "did not answer kube-apiserver (it fails open" in unchanged.what
    other = webhooks.check_probe(
        Probe("placement.topoalloc.io", "topoalloc.io/placement", refused="exceeded quota")
    )
    assert other.status == WARN


def test_no_configuration_fails_and_no_probe_warns() -> None:
    f = facts()
    f.probes, f.probe_note = [], "creating pods in namespace default is not allowed"
    assert statuses(webhooks.check(f)) == [OK, OK, WARN]
    f.webhooks = None
    [found] = webhooks.check(f)
    assert found.status == FAIL and "no MutatingWebhookConfiguration topoalloc-gang" in found.what


def test_the_bundle_is_compared_as_decoded_bytes() -> None:
    f = facts()
    hook = f.webhooks["webhooks"][0]
    hook["clientConfig"]["caBundle"] = base64.b64encode(
        base64.b64decode(hook["clientConfig"]["caBundle"]) + b"\n"
    ).decode()
    assert statuses(webhooks.check_ca(f, f.webhooks["webhooks"])) == [OK]
