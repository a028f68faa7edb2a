"""Scenario 6: the agent's RBAC and ValidatingAdmissionPolicy (daemonset/) evaluated by a real
kube-apiserver, through impersonation of the agent's ServiceAccount with the node-name extra of
its bound token; and the extender's mutual TLS refusing clients it must not serve.

Every refusal is checked for the policy's own message: a request refused because the policy
failed to evaluate (`expression evaluation error`, `no such key`) is a broken policy, not a
decision."""

from __future__ import annotations

import datetime as dt
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3

from tests.cluster.harness import DEVICES, ClusterEnv
from tests.support.cluster_product import ALLOCATOR_SERVICE_DNS
from tests.support.controlplane import HOST, ApiStatus, Rest

OWN, OTHER = "sec-own", "sec-other"
AGENT_USER = "system:serviceaccount:topoalloc-system:topoalloc-agent"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
FOREIGN = "the agent on node sec-own may only write its own Device and Node"
NODE_RULE = (
    "on the Node the agent may only change its node.koordinator.sh/gpu-*, node.koordinator.sh/numa-topology-policy "
    "and topoalloc.io/{device-mode,topology-manager-scope,cpu-manager-policy,numa-cpus} labels"
)
SLICE_RULE = "the agent may only write ResourceSlices of driver topoalloc.io for its own node and pool"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
STATUS_RULE = (
    "on the Node's status the agent may only change koordinator.sh/ and kubernetes.io/mid- resources"
)
UNBOUND = "the agent's token is not bound to a node"
POD_RULE = (
    "on a pod the agent may only change the device-allocated annotation (and allocated-node, to its node) "
    "of a pod bound to its node"
)
ALLOCATED = "scheduling.koordinator.sh/device-allocated"


@pytest.fixture(scope="module", autouse=True)
def nodes(cluster: ClusterEnv) -> Iterator[None]:
    cluster.add_node(OWN, "a100-pcie-4x-no-rdma", gpus=4)
    cluster.add_node(OTHER, "a100-pcie-4x-no-rdma", gpus=4)
    cluster.wait_device(OWN)
    cluster.wait_device(OTHER)
    yield
    cluster.remove_node(OWN)
    cluster.remove_node(OTHER)


@pytest.fixture
def agent(cluster: ClusterEnv) -> Rest:
    """The agent of node OWN, as its bound ServiceAccount token presents it."""
    return cluster.cp.admin.impersonating(AGENT_USER, extra={NODE_NAME_EXTRA: OWN})


def refused(call: Callable[[], Any]) -> ApiStatus:
    with pytest.raises(ApiStatus) as info:
        call()
    err = info.value
    for broken in ("evaluation error", "resulted in error", "no such key", "fails to evaluate"):
        assert broken not in err.message, err.message
    return err


def denied_by_policy(call: Callable[[], Any], message: str) -> None:
    err = refused(call)
    assert err.status == 403, err
    assert "topoalloc-agent-own-node" in err.message and message in err.message, err.message


def merge(rest: Rest, path: str, body: dict[str, Any]) -> Any:
    return rest.merge_patch(path, body)


# -- allowed ---------------------------------------------------------------------------------------


def test_own_labels_status_and_device_allowed(agent: Rest) -> None:
    merge(
        agent,
        f"/api/v1/nodes/{OWN}",
        {"metadata": {"labels": {"node.koordinator.sh/gpu-model": "A100-test"}}},
    )
    merge(
        agent,
        f"/api/v1/nodes/{OWN}/status",
        {
            "status": {
                "capacity": {"koordinator.sh/gpu-core": "400"},
                "allocatable": {"koordinator.sh/gpu-core": "400"},
            }
        },
    )
    device = agent.get(f"{DEVICES}/{OWN}")
    agent.put(f"{DEVICES}/{OWN}", device)
    device = agent.get(f"{DEVICES}/{OWN}")
    agent.put(f"{DEVICES}/{OWN}/status", device)


def test_the_running_agent_never_hit_an_evaluation_error(cluster: ClusterEnv) -> None:
    for proc in cluster.agents:
        text = proc.process.text()
        assert "evaluation error" not in text and "Forbidden" not in text, proc.process.tail()


def _slice(node: str, driver: str = "topoalloc.io", name: str = "") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{driver}-sec"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
        },
    }


def test_own_mode_label_and_resource_slices_allowed(cluster: ClusterEnv, agent: Rest) -> None:
    merge(agent, f"/api/v1/nodes/{OWN}", {"metadata": {"labels": {"topoalloc.io/device-mode": "dra"}}})
    made = agent.post(SLICES, _slice(OWN))
    made["spec"]["devices"][0]["attributes"]["type"] = {"string": "rdma"}
    agent.put(f"{SLICES}/{made['metadata']['name']}", made)
    assert agent.get(SLICES, fieldSelector=f"spec.nodeName={OWN}")["items"]
    agent.delete(f"{SLICES}/{made['metadata']['name']}")
    merge(agent, f"/api/v1/nodes/{OWN}", {"metadata": {"labels": {"topoalloc.io/device-mode": None}}})


def test_own_kubelet_policy_labels_allowed_on_its_own_node_only(cluster: ClusterEnv, agent: Rest) -> None:
    labels = {
        "node.koordinator.sh/numa-topology-policy": "SingleNUMANode",
        "topoalloc.io/topology-manager-scope": "container",
        "topoalloc.io/cpu-manager-policy": "static",
        "topoalloc.io/numa-cpus": "0.112.108_1.112.112",
    }
    merge(agent, f"/api/v1/nodes/{OWN}", {"metadata": {"labels": labels}})
    assert labels.items() <= cluster.cp.admin.get(f"/api/v1/nodes/{OWN}")["metadata"]["labels"].items()
    denied_by_policy(
        lambda: merge(agent, f"/api/v1/nodes/{OTHER}", {"metadata": {"labels": labels}}), FOREIGN
    )
    merge(agent, f"/api/v1/nodes/{OWN}", {"metadata": {"labels": dict.fromkeys(labels)}})


def test_other_nodes_and_drivers_resource_slices_denied(cluster: ClusterEnv, agent: Rest) -> None:
    denied_by_policy(lambda: agent.post(SLICES, _slice(OTHER)), SLICE_RULE)
    denied_by_policy(lambda: agent.post(SLICES, _slice(OWN, "gpu.nvidia.com")), SLICE_RULE)
    theirs = cluster.cp.admin.post(SLICES, _slice(OTHER, name="sec-theirs"))
    try:
        # (a slice's node and pool are immutable: the API server refuses moving one before the policy)
        changed = dict(theirs, spec=dict(theirs["spec"], devices=[]))
        denied_by_policy(lambda: agent.put(f"{SLICES}/sec-theirs", changed), SLICE_RULE)
        denied_by_policy(lambda: agent.delete(f"{SLICES}/sec-theirs"), SLICE_RULE)
    finally:
        cluster.cp.admin.delete(f"{SLICES}/sec-theirs")
    # claims are read, never written
    err = refused(lambda: agent.post("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", {}))
    assert err.status == 403 and "cannot" in err.message, err.message


# -- denied by the policy, with its message -----------------------------------------------------


def test_another_nodes_device_and_node_denied(agent: Rest) -> None:
    device = agent.get(f"{DEVICES}/{OTHER}")  # reading is allowed
    denied_by_policy(lambda: agent.put(f"{DEVICES}/{OTHER}", device), FOREIGN)
    denied_by_policy(
        lambda: merge(
            agent, f"/api/v1/nodes/{OTHER}", {"metadata": {"labels": {"node.koordinator.sh/gpu-model": "x"}}}
        ),
        FOREIGN,
    )
    denied_by_policy(
        lambda: merge(
            agent, f"/api/v1/nodes/{OTHER}/status", {"status": {"capacity": {"koordinator.sh/gpu-core": "1"}}}
        ),
        FOREIGN,
    )


def test_taint_on_own_node_denied(agent: Rest) -> None:
    taint = {"key": "evil", "value": "x", "effect": "NoSchedule"}
    denied_by_policy(lambda: merge(agent, f"/api/v1/nodes/{OWN}", {"spec": {"taints": [taint]}}), NODE_RULE)


def test_foreign_label_on_own_node_denied(agent: Rest) -> None:
    denied_by_policy(
        lambda: merge(agent, f"/api/v1/nodes/{OWN}", {"metadata": {"labels": {"team": "mine"}}}), NODE_RULE
    )
    denied_by_policy(
        lambda: merge(
            agent, f"/api/v1/nodes/{OWN}", {"metadata": {"labels": {"kubernetes.io/hostname": None}}}
        ),
        NODE_RULE,
    )


def test_non_topoalloc_status_denied(agent: Rest) -> None:
    denied_by_policy(
        lambda: merge(
            agent, f"/api/v1/nodes/{OWN}/status", {"status": {"allocatable": {"nvidia.com/gpu": "64"}}}
        ),
        STATUS_RULE,
    )
    denied_by_policy(
        lambda: merge(agent, f"/api/v1/nodes/{OWN}/status", {"status": {"capacity": {"cpu": "1000"}}}),
        STATUS_RULE,
    )


def test_token_without_node_denied(cluster: ClusterEnv) -> None:
    unbound = cluster.cp.admin.impersonating(AGENT_USER)
    denied_by_policy(
        lambda: merge(
            unbound, f"/api/v1/nodes/{OWN}", {"metadata": {"labels": {"node.koordinator.sh/gpu-model": "x"}}}
        ),
        UNBOUND,
    )


def test_pods_only_the_annotation_of_its_own_nodes_pods(cluster: ClusterEnv, agent: Rest, ns: str) -> None:
    for name, node in (("mine", OWN), ("theirs", OTHER)):
        cluster.create_pod(
            ns,
            {
                "metadata": {"name": name, "annotations": {ALLOCATED: '{"gpu":[{"minor":0}]}'}},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.example/x:1"}]},
            },
        )
    fixed = {"metadata": {"annotations": {ALLOCATED: '{"gpu":[{"minor":1}]}'}}}
    merge(agent, f"/api/v1/namespaces/{ns}/pods/mine", fixed)  # the device plugin's correction
    denied_by_policy(lambda: merge(agent, f"/api/v1/namespaces/{ns}/pods/theirs", fixed), POD_RULE)
    denied_by_policy(
        lambda: merge(agent, f"/api/v1/namespaces/{ns}/pods/mine", {"metadata": {"labels": {"a": "b"}}}),
        POD_RULE,
    )


def test_rbac_refuses_what_the_agent_never_needs(agent: Rest) -> None:
    for call in (
        lambda: agent.delete(f"/api/v1/nodes/{OWN}"),
        lambda: agent.delete(f"{DEVICES}/{OWN}"),
        lambda: agent.get("/api/v1/namespaces/topoalloc-system/secrets"),
        lambda: agent.post("/api/v1/nodes", {"metadata": {"name": "sec-new"}}),
    ):
        err = refused(call)
        assert err.status == 403 and "cannot" in err.message, err.message


# -- the extender's mutual TLS ------------------------------------------------------------------


def _filter(cluster: ClusterEnv, context: ssl.SSLContext) -> int:
    replica = cluster.leader()
    http = urllib3.PoolManager(
        ssl_context=context, retries=False, timeout=10, assert_hostname=ALLOCATOR_SERVICE_DNS
    )
    resp = http.request(
        "POST",
        f"https://{HOST}:{replica.port}/filter",
        body=b'{"Pod":{"metadata":{"name":"p","namespace":"default"}},"NodeNames":[]}',
        headers={"Content-Type": "application/json"},
    )
    return resp.status


def _client_context(cluster: ClusterEnv, cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cluster.certs / "ca.crt"))
    if cert:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


def _issue(
    cluster: ClusterEnv, name: str, cn: str, *, foreign_ca: bool = False, expired: bool = False
) -> tuple[Path, Path]:
    from allocator.runtime import certs as pki

    if foreign_ca:
        ca = pki.make_ca("someone-else")
    else:
        ca = pki.Issued.load(cluster.certs / "ca.crt", cluster.certs / "ca.key")
    if expired:  # valid from 10 days ago until yesterday
        ten_days_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
        leaf = pki.issue(
            ca, cn, organization=pki.SCHEDULER_CLIENT_ORG, client=True, not_before=ten_days_ago, days=9
        )
    else:
        leaf = pki.scheduler_client_cert(ca, common_name=cn)
    out = cluster.workdir / "bad-clients"
    leaf.write(out / f"{name}.crt", out / f"{name}.key")
    return out / f"{name}.crt", out / f"{name}.key"


def test_extender_serves_the_scheduler_cert(cluster: ClusterEnv) -> None:
    good = (cluster.certs / "client.crt", cluster.certs / "client.key")
    assert _filter(cluster, _client_context(cluster, good)) == 200


@pytest.mark.parametrize("case", ["no-cert", "other-ca", "expired", "cn-not-allowed"])
def test_extender_refuses_bad_clients(cluster: ClusterEnv, case: str) -> None:
    cert = {
        "no-cert": lambda: None,
        "other-ca": lambda: _issue(cluster, case, "kube-scheduler-extender-client", foreign_ca=True),
        "expired": lambda: _issue(cluster, case, "kube-scheduler-extender-client", expired=True),
        "cn-not-allowed": lambda: _issue(cluster, case, "someone-else"),
    }[case]()
    try:
        status = _filter(cluster, _client_context(cluster, cert))
    except (urllib3.exceptions.HTTPError, ssl.SSLError, OSError):
        return  # refused in the handshake
    assert status in (401, 403), f"{case}: answered {status}"
