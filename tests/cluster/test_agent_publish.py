"""Scenario 1: the long-running agent (fixture mode, its own node-bound ServiceAccount identity)
publishes and keeps up to date its Device and its Node's labels and extended resources on a real
kube-apiserver; the CRDs apply cleanly with kubectl and their printer columns show."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.harness import DEVICES, ClusterEnv
from tests.support.controlplane import REPO, wait_until

NODE = "pub-dgx"


@pytest.fixture(scope="module")
def published(cluster: ClusterEnv) -> Iterator[str]:
    cluster.add_node(NODE, "dgx-h100", gpus=8)
    cluster.wait_device(NODE)
    yield NODE
    cluster.remove_node(NODE)


def test_crds_apply_cleanly_and_again_unchanged(cluster: ClusterEnv) -> None:
    # The session applied them once; a second apply is a no-op with no warning (an unknown field or
    # a schema the server rewrites would show here).
    done = cluster.cp.kubectl("apply", "-k", str(REPO / "deploy" / "crds"))
    assert "Warning" not in done.stderr, done.stderr
    assert all(line.endswith("unchanged") for line in done.stdout.splitlines()), done.stdout
    crds = cluster.cp.kubectl("get", "crd", "-o", "name").stdout.split()
    assert "customresourcedefinition.apiextensions.k8s.io/devices.scheduling.koordinator.sh" in crds
    assert "customresourcedefinition.apiextensions.k8s.io/podgroups.scheduling.x-k8s.io" in crds


def test_agent_publishes_device_and_node(cluster: ClusterEnv, published: str) -> None:
    device = cluster.cp.admin.get(f"{DEVICES}/{published}")
    kinds = [d["type"] for d in device["spec"]["devices"]]
    assert kinds.count("gpu") == 8 and kinds.count("rdma") >= 8
    # The status the CRD schema keeps (a field it lacks would be pruned silently: read it back).
    assert device["status"]["summary"]["gpus"] == 8
    node = wait_until(
        lambda: (
            (n := cluster.cp.admin.get(f"/api/v1/nodes/{published}"))["status"]["allocatable"].get(
                "koordinator.sh/gpu-core"
            )
            and n
        ),
        timeout=60,
        what="the agent's extended resources on the Node",
    )
    assert node["metadata"]["labels"]["node.koordinator.sh/gpu-model"] == "H100-80GB-HBM3"
    assert node["status"]["allocatable"]["koordinator.sh/gpu-core"] == "800"
    assert node["status"]["capacity"]["koordinator.sh/rdma"] == "800"
    # What the node registered with is untouched.
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    # Owned by its Node: deleting the Node garbage-collects the Device (kube-controller-manager).
    owners = device["metadata"].get("ownerReferences") or []
    assert [o["uid"] for o in owners] == [node["metadata"]["uid"]]


def test_printer_columns_show(cluster: ClusterEnv, published: str) -> None:
    out = cluster.cp.kubectl("get", "devices", published).stdout.splitlines()
    header, row = out[0].split(), out[1].split()
    assert header[:2] == ["NAME", "GPUS"] and "MODEL" in header and "NICS" in header and "HEALTHY" in header
    values = dict(zip(["NAME", "GPUS", "MODEL_", "NICS", "HEALTHY"], row, strict=False))
    assert values["NAME"] == published and values["GPUS"] == "8"
    assert row[2] == "H100-80GB-HBM3"


def test_agent_restores_its_node_resources(cluster: ClusterEnv, published: str) -> None:
    # Someone strips one of the agent's resources off the Node status: the agent's first pass after
    # it re-reads the Node (at most every 60 s: Publisher.read_node's max_age) puts it back, through
    # the status subresource its RBAC and admission policy allow.
    cluster.cp.admin.request(
        "PATCH",
        f"/api/v1/nodes/{published}/status",
        {
            "status": {
                "capacity": {"koordinator.sh/gpu-core": None},
                "allocatable": {"koordinator.sh/gpu-core": None},
            }
        },
        content_type="application/merge-patch+json",
    )
    assert (
        "koordinator.sh/gpu-core"
        not in cluster.cp.admin.get(f"/api/v1/nodes/{published}")["status"]["allocatable"]
    )
    wait_until(
        lambda: (
            cluster.cp.admin.get(f"/api/v1/nodes/{published}")["status"]["allocatable"].get(
                "koordinator.sh/gpu-core"
            )
            == "800"
        ),
        timeout=90,  # 60 s between reads of the Node, and a loaded machine
        what="the agent to restore koordinator.sh/gpu-core",
    )
