"""The DRA pieces of deploy/allocator agree with the code: the gate's webhook entry, the config
block, RBAC for claims on both Kubernetes versions."""

from __future__ import annotations

import celpy

from allocator.claims.webhook import CLAIMS_PATH, PATH
from allocator.runtime.admission_settings import WEBHOOK_SERVICE
from tests.gang.test_deploy import configuration
from tests.runtime.test_deploy import DEPLOY, allocator_config, one


def test_the_dra_gate_reviews_pods_with_claims_and_fails_open() -> None:
    (hook,) = [h for h in configuration()["webhooks"] if h["name"] == "dra.topoalloc.io"]
    assert hook["clientConfig"]["service"]["name"] == WEBHOOK_SERVICE
    assert hook["clientConfig"]["service"]["path"] == PATH
    assert hook["failurePolicy"] == "Ignore"
    (cond,) = [c for c in hook["matchConditions"] if c["name"] == "names-resource-claims"]
    env = celpy.Environment()
    only_claims = env.program(env.compile(cond["expression"]))
    with_claims = {"spec": {"resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t"}]}}
    for pod, sent in ((with_claims, True), ({"spec": {}}, False), ({"spec": {"resourceClaims": []}}, False)):
        assert bool(only_claims.evaluate({"object": celpy.json_to_cel(pod)})) is sent


def test_the_config_file_has_the_dra_block() -> None:
    cfg = allocator_config()
    assert cfg.dra.enabled and cfg.dra.concurrency > 0


def test_rbac_writes_claim_status_on_both_versions_and_reads_the_rest() -> None:
    rules = one(DEPLOY / "allocator" / "rbac.yaml", "ClusterRole")["rules"]
    dra = [r for r in rules if r["apiGroups"] == ["resource.k8s.io"]]
    grants = {(res, v) for r in dra for res in r["resources"] for v in r["verbs"]}
    for res in ("deviceclasses", "resourceslices", "resourceclaimtemplates", "resourceclaims"):
        assert {(res, "list"), (res, "watch")} <= grants
    assert ("resourceclaims/status", "patch") in grants  # 1.35
    assert ("resourceclaims/binding", "patch") in grants  # 1.36: granular status authorization
    assert not any(v in ("create", "delete", "update") for _, v in grants)
    # Claims announcing a device to kube-scheduler: made and deleted in the allocator's namespace.
    role = one(DEPLOY / "allocator" / "rbac.yaml", "Role")
    own = {
        (res, v)
        for r in role["rules"]
        if r["apiGroups"] == ["resource.k8s.io"]
        for res in r["resources"]
        for v in r["verbs"]
    }
    assert own == {("resourceclaims", "create"), ("resourceclaims", "delete")}
    assert role["metadata"]["namespace"] == "topoalloc-system"


def test_claims_asking_for_topoalloc_devices_are_marked_at_creation_and_fail_open() -> None:
    (hook,) = [h for h in configuration()["webhooks"] if h["name"] == "claims.dra.topoalloc.io"]
    assert hook["clientConfig"]["service"]["path"] == CLAIMS_PATH and hook["failurePolicy"] == "Ignore"
    (rule,) = hook["rules"]
    assert rule["resources"] == ["resourceclaims"] and rule["apiGroups"] == ["resource.k8s.io"]
    (cond,) = hook["matchConditions"]
    env = celpy.Environment()
    ours = env.program(env.compile(cond["expression"]))

    def claim(cls: str) -> dict[str, object]:
        return {"spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": cls}}]}}}

    for obj, sent in (
        (claim("gpu.topoalloc.io"), True),
        (claim("gpu.nvidia.com"), False),
        ({"spec": {}}, False),
    ):
        assert bool(ours.evaluate({"object": celpy.json_to_cel(obj)})) is sent
