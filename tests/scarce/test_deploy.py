"""The scarce-avoidance pieces of deploy/ agree with the code: the webhook entry (path, fail open,
the opt-out label on pods and namespaces, pods bound at creation never sent), the config block, and
the node labels: every label the agent's DaemonSet selects GPU nodes by marks a node to avoid."""

from __future__ import annotations

from collections.abc import Iterator

import celpy
import pytest
import yaml

from allocator.runtime.admission_settings import WEBHOOK_SERVICE
from allocator.runtime.config import ServiceConfig
from allocator.runtime.scarce_settings import DEFAULT_NODE_LABELS
from allocator.scarce.webhook import OPT_OUT, PATH, requests_only_plain
from apis import keys
from tests.gang.test_deploy import configuration
from tests.runtime.test_deploy import allocator_config
from tests.support.controlplane import REPO
from topoalloc.commands.installer import tls
from topoalloc.commands.installer.manifests import ClusterFacts, InstallOptions, render

NAME = "scarce-avoidance.topoalloc.io"


def hook() -> dict:
    (found,) = [h for h in configuration()["webhooks"] if h["name"] == NAME]
    return found


def test_the_entry_calls_the_route_and_fails_open() -> None:
    h = hook()
    assert h["clientConfig"]["service"]["name"] == WEBHOOK_SERVICE
    assert h["clientConfig"]["service"]["path"] == PATH
    assert h["failurePolicy"] == "Ignore"
    assert h["timeoutSeconds"] <= 2  # every pod creation in the cluster waits for it
    (rule,) = h["rules"]
    assert rule["operations"] == ["CREATE"] and rule["resources"] == ["pods"]


def test_pods_and_namespaces_opt_out_by_label() -> None:
    h = hook()
    opt_out = {"key": keys.SCARCE_AVOIDANCE, "operator": "NotIn", "values": [OPT_OUT]}
    assert h["objectSelector"]["matchExpressions"] == [opt_out]
    assert opt_out in h["namespaceSelector"]["matchExpressions"]
    system = h["namespaceSelector"]["matchExpressions"][0]
    assert system["operator"] == "NotIn" and {"kube-system", "topoalloc-system"} <= set(system["values"])


def _condition(name: str) -> str:
    (found,) = [c["expression"] for c in hook()["matchConditions"] if c["name"] == name]
    return found


def test_pods_bound_at_creation_are_not_sent() -> None:
    cond = {"expression": _condition("not-bound-at-creation")}
    env = celpy.Environment()
    program = env.program(env.compile(cond["expression"]))
    for spec, sent in (({}, True), ({"nodeName": ""}, True), ({"nodeName": "n1"}, False)):
        assert bool(program.evaluate({"object": celpy.json_to_cel({"spec": spec})})) is sent


def _pods() -> Iterator[dict]:
    """Pods over the resource shapes the route judges: plain names, devices, extended names, init
    containers, pod-level resources, claims, no resources at all."""
    names = ["cpu", "memory", "hugepages-2Mi", "kubernetes.io/batch-cpu", "nvidia.com/gpu",
             "koordinator.sh/rdma", "example.com/fpga", "ephemeral-storage"]  # fmt: skip
    for i, name in enumerate(names):
        for part in ("requests", "limits"):
            yield {"spec": {"containers": [{"name": "a", "resources": {part: {"cpu": "1", name: "1"}}}]}}
            yield {"spec": {"containers": [{"name": "a"}], "initContainers": [
                {"name": "i", "resources": {part: {name: "1"}}}]}}  # fmt: skip
            yield {"spec": {"containers": [{"name": "a", "resources": {}}], "resources": {part: {name: "1"}}}}
            other = names[(i + 3) % len(names)]
            yield {"spec": {"containers": [{"name": "a", "resources": {part: {name: "1"}}},
                                           {"name": "b", "resources": {part: {other: "1"}}}]}}  # fmt: skip
    yield {"spec": {"containers": [{"name": "a"}]}}
    yield {"spec": {"containers": [{"name": "a"}], "resourceClaims": [{"name": "gpu"}]}}
    yield {"spec": {"containers": [{"name": "a"}], "resourceClaims": []}}


def test_only_pods_requesting_no_device_are_sent() -> None:
    """The matchCondition agrees with the route's own judgement (requests_only_plain) on every
    shape: a GPU pod's creation never calls the route."""
    env = celpy.Environment()
    program = env.program(env.compile(_condition("requests-no-device")))
    seen = set()
    for pod in _pods():
        got = program.evaluate(celpy.json_to_cel({"object": pod}))
        assert not isinstance(got, celpy.CELEvalError), (pod, got)
        assert bool(got) is requests_only_plain(pod), pod
        seen.add(bool(got))
    assert seen == {True, False}


def test_the_config_block_is_the_default_and_every_gpu_node_label_is_avoided() -> None:
    cfg = allocator_config().scarce_avoidance
    assert cfg.enabled and 1 <= cfg.weight <= 100
    assert cfg.node_labels == list(DEFAULT_NODE_LABELS)
    daemonset = next(
        d
        for d in yaml.safe_load_all((REPO / "daemonset" / "daemonset.yaml").read_text())
        if d["kind"] == "DaemonSet"
    )
    terms = daemonset["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    gpu_node_labels = {e["key"] for t in terms for e in t["matchExpressions"]}
    assert gpu_node_labels | {keys.GPU_VENDOR} == set(cfg.node_labels)


@pytest.mark.parametrize("mode", ["secondary", "kubeadm"])
def test_topoalloc_install_renders_the_entry_and_the_config_block(mode: str) -> None:
    opts = InstallOptions(version="9.9.9", scheduler_version="v1.35.6", mode=mode, gang_failure_policy="Fail")
    docs = render(opts, ClusterFacts(tls=tls.issue_secrets()))
    (config,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    (entry,) = [h for h in config["webhooks"] if h["name"] == NAME]
    assert entry["failurePolicy"] == "Ignore"  # never the gang's Fail: it would refuse every pod
    assert entry["clientConfig"]["caBundle"]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "topoalloc-allocator"]
    settings = ServiceConfig.from_mapping(yaml.safe_load(cm["data"]["allocator.yaml"])).scarce_avoidance
    assert settings.enabled and settings.node_labels == list(DEFAULT_NODE_LABELS)
