"""Rehearsing a GPU failure on the real control plane: the agent process (fixture mode, its own
node-bound identity, so its RBAC and admission policy apply) takes an Xid through its
`--fixture-events` folder from `topoalloc agent inject-event`, and the GPU turns unhealthy in its
Device CR (with the Xid in the status and the Node's GPU resources one GPU lower)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import DEVICES, ClusterEnv
from tests.support.cluster_product import agent_argv, topoalloc_argv
from tests.support.controlplane import wait_until
from tests.support.processes import Process

NODE = "xid-dgx"


@pytest.fixture(scope="module")
def inbox(cluster: ClusterEnv) -> Iterator[Path]:
    folder = cluster.workdir / f"{NODE}-events"
    cluster.add_node(NODE, "dgx-h100", gpus=8, agent=False)
    argv = agent_argv("dgx-h100", NODE, cluster.agent_identity(NODE), 30, "--fixture-events", str(folder))
    agent = Process(f"agent-{NODE}", argv, cluster.workdir / f"agent-{NODE}.log").start()
    cluster.extra.append(agent)
    try:
        cluster.wait_device(NODE)
        yield folder
    finally:
        agent.stop()
        cluster.remove_node(NODE)


def _gpu(cluster: ClusterEnv, minor: int) -> tuple[dict, dict]:
    device = cluster.cp.admin.get(f"{DEVICES}/{NODE}")
    spec = next(d for d in device["spec"]["devices"] if d["type"] == "gpu" and d["minor"] == minor)
    status = next(d for d in device["status"]["devices"] if d["type"] == "gpu" and d["minor"] == minor)
    return spec, status


def test_an_injected_xid_makes_the_gpu_unhealthy_in_the_device(cluster: ClusterEnv, inbox: Path) -> None:
    assert _gpu(cluster, 6)[0]["health"] is True
    ratio = wait_until(
        lambda: cluster.cp.admin.get(f"/api/v1/nodes/{NODE}")["status"]["allocatable"].get(
            "koordinator.sh/gpu-memory-ratio"
        ),
        timeout=60,
        what="the agent's GPU resources on the Node",
    )
    assert ratio == "800"
    subprocess.run(
        topoalloc_argv("agent", "inject-event", str(inbox), "--gpu", "6", "--xid", "79"),
        check=True,
        capture_output=True,
    )
    # the resync is 30 s here: only the event itself can make this happen in time
    spec = wait_until(
        lambda: (s := _gpu(cluster, 6)[0])["health"] is False and s, timeout=15, what="GPU 6 unhealthy"
    )
    condition = spec["conditions"][0]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Healthy",
        "False",
        "XidCriticalError",
    )
    # the status, written after the spec in its own request, keeps the Xid (the CRD's schema, read back)
    wait_until(lambda: _gpu(cluster, 6)[1].get("lastXid") == 79, timeout=15, what="lastXid 79 in the status")
    assert all(_gpu(cluster, m)[0]["health"] for m in (0, 1, 2, 3, 4, 5, 7))
    wait_until(
        lambda: (
            cluster.cp.admin.get(f"/api/v1/nodes/{NODE}")["status"]["allocatable"].get(
                "koordinator.sh/gpu-memory-ratio"
            )
            == "700"
        ),
        timeout=15,
        what="the Node's GPU resources one GPU lower",
    )
    assert sorted(p.name.rsplit(".", 1)[-1] for p in inbox.iterdir()) == ["done"]
