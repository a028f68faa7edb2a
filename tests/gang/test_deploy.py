"""The gang pieces of deploy/ agree with the code: the webhook's Service, configuration, ports,
certificate names and RBAC; and the leader keeps the configuration's caBundle equal to its CA."""

from __future__ import annotations

import base64
from pathlib import Path

from click.testing import CliRunner
from cryptography import x509

from allocator.gang.webhook import PATH
from allocator.runtime import certs
from allocator.runtime.admission_settings import WEBHOOK_SERVICE
from allocator.runtime.config import DEFAULT_NAMESPACE
from apis import keys
from tests.gang.harness import gang_world, member
from tests.runtime.test_deploy import DEPLOY, allocator_config, one
from tests.support.fakeapi import FakeApiServer
from tests.support.pki import Pki
from tests.support.polling import until
from topoalloc.cli import main

WEBHOOK_YAML = DEPLOY / "allocator" / "webhook.yaml"


def configuration() -> dict:
    return one(WEBHOOK_YAML, "MutatingWebhookConfiguration")


def test_the_webhook_service_reaches_every_replica_on_the_configured_port() -> None:
    svc = one(WEBHOOK_YAML, "Service", WEBHOOK_SERVICE)
    dep = one(DEPLOY / "allocator" / "deployment.yaml", "Deployment")
    assert svc["metadata"]["namespace"] == DEFAULT_NAMESPACE
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]  # not leader-only
    (port,) = svc["spec"]["ports"]
    container = {
        p["name"]: p["containerPort"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert container[port["targetPort"]] == allocator_config().admission.port
    assert "webhook.yaml" in (DEPLOY / "allocator" / "kustomization.yaml").read_text()


def test_every_gang_member_is_reviewed_and_the_gang_webhooks_fail_closed_in_placement_mode() -> None:
    config = configuration()
    cfg = allocator_config()
    assert config["metadata"]["name"] == cfg.admission.webhook_configuration
    svc_port = one(WEBHOOK_YAML, "Service", WEBHOOK_SERVICE)["spec"]["ports"][0]["port"]
    selected = {}
    for hook in config["webhooks"]:
        if hook["name"] in (
            "dra.topoalloc.io",
            "claims.dra.topoalloc.io",
            "claimtemplates.dra.topoalloc.io",
            "scarce-avoidance.topoalloc.io",
            "placement.topoalloc.io",
            "placement-fallback.topoalloc.io",
        ):
            continue  # served beside the gang's (tests/claims, tests/scarce, tests/placement test_deploy.py)
        service = hook["clientConfig"]["service"]
        assert service == {
            "name": WEBHOOK_SERVICE,
            "namespace": DEFAULT_NAMESPACE,
            "path": PATH,
            "port": svc_port,
        }
        assert "caBundle" not in hook["clientConfig"]  # the leader writes it
        (rule,) = hook["rules"]
        assert (
            rule["operations"] == ["CREATE"] and rule["resources"] == ["pods"] and rule["apiGroups"] == [""]
        )
        assert hook["admissionReviewVersions"] == ["v1"] and hook["sideEffects"] == "None"
        assert hook["timeoutSeconds"] < 10  # the API server's default is 10 s; the pod create waits for it
        excluded = hook["namespaceSelector"]["matchExpressions"][0]
        assert excluded["operator"] == "NotIn" and DEFAULT_NAMESPACE in excluded["values"]
        exprs = (hook.get("objectSelector") or {}).get("matchExpressions") or [{"key": None}]
        selected[exprs[0]["key"]] = hook["failurePolicy"]
    # Placement mode (the base's default) fails closed: no extender would hold an ungated member;
    # the extender variants patch them to fail open (tests/install/test_render.py).
    assert selected == {
        keys.POD_GROUP_LABEL: "Fail",
        keys.POD_GROUP_LABEL_LEGACY: "Fail",
        keys.GANG_NAME: "Fail",
        None: "Fail",  # annotation-only Koordinator gangs: a matchCondition selects them
    }


def test_rbac_lets_the_controller_write_status_and_the_caBundle_only() -> None:
    rules = one(DEPLOY / "allocator" / "rbac.yaml", "ClusterRole")["rules"]
    status = [r for r in rules if "podgroups/status" in r["resources"]]
    assert status and status[0]["verbs"] == ["patch"]
    hooks = [r for r in rules if "mutatingwebhookconfigurations" in r["resources"]]
    assert hooks[0]["resourceNames"] == [allocator_config().admission.webhook_configuration]
    assert sorted(hooks[0]["verbs"]) == ["get", "patch"]


def test_both_certificate_paths_name_the_webhook_service(tmp_path: Path) -> None:
    names = certs.service_dns_names(WEBHOOK_SERVICE, DEFAULT_NAMESPACE)
    server = one(
        DEPLOY / "components" / "cert-manager" / "certificates.yaml", "Certificate", "topoalloc-allocator-tls"
    )
    assert set(names) <= set(server["spec"]["dnsNames"])
    result = CliRunner().invoke(main, ["certs", "--out-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names) <= set(sans.get_values_for_type(x509.DNSName))
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    cert.verify_directly_issued_by(ca)  # the CA the leader writes into the caBundle


async def test_the_leader_keeps_the_caBundle_in_step_with_its_ca(fake_api: FakeApiServer, pki: Pki) -> None:
    fake_api.register_crd(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        namespaced=False,
        status_subresource=False,
    )
    manifest = configuration()
    fake_api.put(manifest)
    ca = pki.server.client_ca

    def bundles() -> list[str | None]:
        stored = fake_api.get("mutatingwebhookconfigurations", manifest["metadata"]["name"])
        assert stored is not None
        return [h["clientConfig"].get("caBundle") for h in stored["webhooks"]]

    async with gang_world(fake_api, pki, webhook_configuration=manifest["metadata"]["name"]) as w:
        await until(
            lambda: bundles() == [base64.b64encode(ca.read_bytes()).decode()] * len(manifest["webhooks"]), 5
        )
        # A rotated CA reaches the configuration without a restart.
        rotated = certs.make_ca("rotated-ca").cert_pem + ca.read_bytes()
        ca.write_bytes(rotated)
        await until(lambda: bundles() == [base64.b64encode(rotated).decode()] * len(manifest["webhooks"]), 5)
        # And the webhook keeps answering over TLS meanwhile.
        assert (await w.admission.review(member("x", group="g")))["allowed"]
