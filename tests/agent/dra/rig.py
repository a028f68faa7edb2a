"""The DRA test bed: the real agent in dra mode (discovery on a hw-fixture, the fake API server with
the resource.k8s.io types, its DRA plugin) and the stand-in DRA kubelet, talking the real
registration and DRA gRPC over unix sockets in a short temp dir."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.config import AgentConfig
from agent.dra.service import DraService, DraSettings
from agent.fixtures.loader import Fixture
from agent.kube import Kube
from agent.main_loop import Agent
from apis import dra
from tests.agent.support import FIXTURES, AgentLoop
from tests.support.dra_kubelet import DraKubelet
from tests.support.fakeapi import FakeApiServer
from tests.support.rest import Rest

NODE = "dra-node"
NS = "default"
CONTROL = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


def serve_resource_api(server: FakeApiServer) -> None:
    """The fake API server with resource.k8s.io/v1 ResourceSlices and ResourceClaims (and the field
    selectors a node's agent lists its slices by)."""
    if server.types.lookup("resource.k8s.io", "v1", "resourceslices") is None:
        server.register_crd(
            "resource.k8s.io",
            "v1",
            "resourceslices",
            "ResourceSlice",
            namespaced=False,
            status_subresource=False,
            selectable_fields=("spec.nodeName", "spec.driver"),
        )
        server.register_crd("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True)


def claim_doc(
    name: str,
    results: list[dict[str, Any]],
    *,
    pod_uid: str | None = None,
    allocated: bool = True,
) -> dict[str, Any]:
    """A ResourceClaim as kube-scheduler leaves it: allocated (`results`) and reserved for a pod."""
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {
            "devices": {"results": results},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        }
    if pod_uid is not None:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": pod_uid}]
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": dra.GPU_CLASS}}]}},
        "status": status,
    }


def result(device: str, request: str = "r", driver: str = dra.DRIVER, pool: str = NODE) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}


@dataclass
class DraRig:
    server: FakeApiServer
    api_client: Any
    fixture_name: str = "dgx-h100"
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp")))
    agent: Agent | None = None
    kubelet: DraKubelet | None = None
    fixture_dir: Path | None = None
    fx: Fixture | None = None
    _loop: AgentLoop | None = None

    def __post_init__(self) -> None:
        serve_resource_api(self.server)
        self.registry = self.root / "reg"
        self.plugin_dir = self.root / "plugin"
        self.dev = self.root / "dev"
        self.cdi = self.root / "cdi"
        self.state = self.root / "state"
        self.dev.mkdir(parents=True)
        for name in CONTROL:
            (self.dev / name).touch()
        self.rest = Rest(self.server.url)
        self.server.put(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": NODE},
                "status": {"capacity": {"cpu": "64"}, "allocatable": {"cpu": "64"}},
            }
        )

    def start_kubelet(self) -> DraKubelet:
        self.kubelet = DraKubelet(self.registry, self.rest.get).start()
        return self.kubelet

    def start_agent(self, *, wait: bool = True) -> Agent:
        config = AgentConfig(resync_seconds=30, mode=dra.MODE_DRA)
        config.mid_tier.enabled = False
        config.health.event_wait_ms = 50
        self.fx = Fixture.load(self.fixture_dir or FIXTURES / self.fixture_name)
        kube = Kube(self.api_client)
        settings = DraSettings(
            registry_dir=str(self.registry),
            plugin_dir=str(self.plugin_dir),
            cdi_root=str(self.cdi),
            dev_root=str(self.dev),
            host_dev="/dev",
            state_dir=str(self.state),
            check_seconds=0.1,
        )
        plugin = DraService(settings, node_name=NODE, sysfs_root=self.fx.sys_root, kube=kube)
        self.agent = Agent(
            node_name=NODE,
            nvml=self.fx.nvml,
            sysfs_root=self.fx.sys_root,
            config=config,
            kube=kube,
            dra_plugin=plugin,
        )
        registered = len(self.kubelet.registrations) if self.kubelet is not None else 0
        self._loop = AgentLoop(self.agent)
        if wait and self.kubelet is not None:
            self.kubelet.wait_registered(dra.DRIVER, count=registered + 1)
        return self.agent

    def stop_agent(self) -> None:
        if self._loop is not None:
            self._loop.stop()
        self._loop = None

    @property
    def plugin(self) -> DraService:
        assert self.agent is not None and isinstance(self.agent.dra_plugin, DraService)
        return self.agent.dra_plugin

    def put_claim(self, name: str, results: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        return self.server.put(claim_doc(name, results, **kwargs))

    def pod(
        self, name: str, claims: dict[str, str], containers: dict[str, list[str]] | None = None
    ) -> dict[str, Any]:
        """A pod bound to the node using existing claims (pod claim name -> ResourceClaim name);
        `containers`: container -> pod claim names it uses (default: one container using all)."""
        containers = containers or {"main": list(claims)}
        return {
            "metadata": {"name": name, "namespace": NS, "uid": str(uuid.uuid4())},
            "spec": {
                "nodeName": NODE,
                "resourceClaims": [{"name": k, "resourceClaimName": v} for k, v in claims.items()],
                "containers": [
                    {"name": c, "resources": {"claims": [{"name": n} for n in names]}}
                    for c, names in containers.items()
                ],
            },
        }

    def claim_pod(
        self, pod_name: str, claim_name: str, devices: list[str], **kwargs: Any
    ) -> tuple[dict, dict]:
        """A pod and the claim allocated `devices` (request "r") reserved for it."""
        pod = self.pod(pod_name, {"c": claim_name})
        claim = self.put_claim(
            claim_name, [result(d) for d in devices], pod_uid=pod["metadata"]["uid"], **kwargs
        )
        return pod, claim

    def slices(self) -> list[dict[str, Any]]:
        return [s for s in self.server.list_objects("resourceslices") if s["spec"]["nodeName"] == NODE]

    def close(self) -> None:
        self.stop_agent()
        if self.kubelet is not None:
            self.kubelet.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def exercise_dra(server: FakeApiServer, api_client: Any) -> None:
    """Drive every API call of dra mode (for the RBAC test): list the node's slices, create them,
    delete a stale one, update them on a health change, read a claim to prepare it."""
    from agent.dra.slices import pool_slices
    from tests.agent.support import wait_for

    rig = DraRig(server, api_client)
    try:
        stale = pool_slices(NODE, [], 1)[0]
        stale["metadata"]["name"] = f"{NODE}-{dra.DRIVER}-9"
        server.put(stale)
        kubelet = rig.start_kubelet()
        rig.start_agent()
        assert wait_for(
            lambda: [s["metadata"]["name"] for s in rig.slices()] == [f"{NODE}-{dra.DRIVER}-0"], 10
        )
        assert rig.fx is not None and rig.agent is not None
        generation = rig.slices()[0]["spec"]["pool"]["generation"]
        rig.fx.nvml.lose(0)
        rig.agent.request_resync()
        assert wait_for(lambda: rig.slices()[0]["spec"]["pool"]["generation"] == generation + 1, 10)
        pod, _ = rig.claim_pod("rbac", "rbac-claim", ["gpu-1"])
        kubelet.prepare(pod)
    finally:
        rig.close()
