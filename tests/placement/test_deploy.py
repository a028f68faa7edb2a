"""The placement webhook of deploy/allocator/webhook.yaml agrees with the allocator: the route, called
through the leader-only Service on the webhook port (the leader places pods at admission), the
certificate naming that Service, the resource names its matchConditions send (the same as
`placement.resources`), failing open, the opt-outs; the shipped config turns placement on and RBAC
lets it write what it writes."""

from __future__ import annotations

from typing import Any

import celpy
import yaml

from allocator.placement.webhook import GATE_PATH, PATH
from allocator.runtime import certs
from allocator.runtime.admission_settings import LEADER_SERVICE, WEBHOOK_SERVICE
from allocator.runtime.config import DEFAULT_NAMESPACE, ServiceConfig
from allocator.runtime.placement_settings import PlacementSettings
from apis import keys
from tests.placement.harness import gpu_pod
from tests.runtime.test_deploy import allocator_config, one

DEPLOY = __import__("pathlib").Path(__file__).resolve().parents[2] / "deploy" / "allocator"
_ENV = celpy.Environment()


def _hook(name: str = "placement.topoalloc.io") -> dict[str, Any]:
    docs = yaml.safe_load_all((DEPLOY / "webhook.yaml").read_text())
    config = next(d for d in docs if d and d["kind"] == "MutatingWebhookConfiguration")
    (hook,) = [h for h in config["webhooks"] if h["name"] == name]
    return dict(hook)


FALLBACK = "placement-fallback.topoalloc.io"


def _sent(pod: dict[str, Any], name: str = "placement.topoalloc.io") -> bool:
    """Whether kube-apiserver would send `pod` to the entry (every matchCondition true)."""
    activation = celpy.json_to_cel({"object": pod})
    for cond in _hook(name)["matchConditions"]:
        got = _ENV.program(_ENV.compile(cond["expression"])).evaluate(activation)
        assert not isinstance(got, celpy.CELEvalError), (cond["name"], got)
        if not got:
            return False
    return True


def test_the_route_fails_open_and_keeps_out_of_system_and_opted_out_pods() -> None:
    hook = _hook()
    assert hook["clientConfig"]["service"]["path"] == PATH and hook["failurePolicy"] == "Ignore"
    assert hook["objectSelector"]["matchExpressions"] == [
        {"key": keys.PLACEMENT, "operator": "NotIn", "values": ["false"]}
    ]
    names = hook["namespaceSelector"]["matchExpressions"]
    assert {"key": keys.PLACEMENT, "operator": "NotIn", "values": ["false"]} in names
    assert "topoalloc-system" in names[0]["values"] and "kube-system" in names[0]["values"]


def test_match_conditions_send_exactly_the_pods_asking_for_a_managed_resource() -> None:
    for resource in PlacementSettings().resources:  # one list: the allocator's and the webhook's
        pod = gpu_pod("p")
        pod["spec"]["containers"][0]["resources"] = {"requests": {resource: "1"}}
        assert _sent(pod), resource
    init = gpu_pod("i")
    init["spec"]["containers"][0]["resources"] = {}
    init["spec"]["initContainers"] = [
        {"name": "i", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    ]
    assert _sent(init)
    cpu = gpu_pod("c")
    cpu["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "example.com/fpga-ish": "1"}}
    assert not _sent(cpu)
    bare = gpu_pod("b")
    del bare["spec"]["containers"][0]["resources"]
    assert not _sent(bare)
    bound = gpu_pod("n", nodeName="n1")
    assert not _sent(bound)


def test_the_shipped_config_places_and_rbac_allows_the_writes() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "config.yaml").read_text()))
    cfg = ServiceConfig.from_mapping(yaml.safe_load(docs[0]["data"]["allocator.yaml"]))
    assert cfg.placement.enabled and cfg.placement.pin == "auto"
    rules = next(
        d for d in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()) if d and d["kind"] == "ClusterRole"
    )["rules"]
    granted = {(r, v) for rule in rules for r in rule["resources"] for v in rule["verbs"]}
    assert {("pods", "patch"), ("pods/status", "patch"), ("pods/eviction", "create")} <= granted


def test_the_route_reaches_the_leader_alone_on_its_webhook_port() -> None:
    """Pods are placed at admission by the leader: the route is called through the extender's
    Service, which selects the pod labelled leader; its webhook port reaches the admission server."""
    service = _hook()["clientConfig"]["service"]
    assert service["name"] == LEADER_SERVICE and service["namespace"] == DEFAULT_NAMESPACE
    svc = one(DEPLOY / "service.yaml", "Service", LEADER_SERVICE)
    assert svc["spec"]["selector"]["topoalloc.io/leader"] == "true"
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == service["port"]]
    dep = one(DEPLOY / "deployment.yaml", "Deployment")
    container = {
        p["name"]: p["containerPort"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert container[port["targetPort"]] == allocator_config().admission.port
    # Its certificate names the Service, whoever issues it (`topoalloc certs`, cert-manager).
    names = certs.service_dns_names(LEADER_SERVICE, DEFAULT_NAMESPACE)
    server = one(
        DEPLOY.parent / "components" / "cert-manager" / "certificates.yaml",
        "Certificate",
        "topoalloc-allocator-tls",
    )
    assert set(names) <= set(server["spec"]["dnsNames"])
    # Devices are held for the pod being created, none for a dry run.
    assert _hook()["sideEffects"] == "NoneOnDryRun" and _hook()["reinvocationPolicy"] == "IfNeeded"


def test_the_fallback_gates_only_what_the_leader_neither_placed_nor_gated() -> None:
    """While the leader does not answer (a leader change), any replica gates the pod; a pod the
    leader answered for is never sent there, so the fallback costs no call otherwise."""
    fallback, first = _hook(FALLBACK), _hook()
    service = fallback["clientConfig"]["service"]
    assert (service["name"], service["path"]) == (WEBHOOK_SERVICE, GATE_PATH)
    assert fallback["failurePolicy"] == "Ignore" and fallback["sideEffects"] == "None"
    same = ("objectSelector", "namespaceSelector", "rules", "timeoutSeconds", "reinvocationPolicy")
    assert all(fallback[k] == first[k] for k in same)
    others = [c for c in fallback["matchConditions"] if c["name"] != "neither-placed-nor-gated"]
    assert others == first["matchConditions"]
    assert _sent(gpu_pod("p"), FALLBACK)
    gated = gpu_pod("g", schedulingGates=[{"name": "other"}, {"name": keys.PLACEMENT_GATE}])
    assert not _sent(gated, FALLBACK) and _sent(gpu_pod("o", schedulingGates=[{"name": "other"}]), FALLBACK)
    placed = gpu_pod("d", metadata={"annotations": {keys.ALLOCATED_NODE: "n1"}})
    assert not _sent(placed, FALLBACK)
    cpu = gpu_pod("c")
    cpu["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    assert not _sent(cpu, FALLBACK)
