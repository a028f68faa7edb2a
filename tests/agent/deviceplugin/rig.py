"""The device plugin test bed: the real agent (discovery on a hw-fixture, the fake API server, its
device plugins) and the stand-in kubelet, talking v1beta1 gRPC over unix sockets in a short temp dir."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.config import AgentConfig
from agent.deviceplugin.inventory import SERVED_RESOURCES
from agent.deviceplugin.service import DevicePluginService, DevicePluginSettings
from agent.fixtures.loader import Fixture
from agent.kube import Kube
from agent.main_loop import Agent
from apis import keys
from apis.annotations import AllocatedVF, DeviceAllocation, DeviceAllocations
from apis.quantity import Format, Quantity
from tests.agent.support import FIXTURES, AgentLoop
from tests.support.fakeapi import FakeApiServer
from tests.support.kubelet import StandInKubelet

NODE = "gpu-node"
CONTROL = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")  # nvidia-modeset absent, as on many hosts


def gpu_entry(minor: int, uuid: str = "", core: int = 100, memory: str = "81559Mi") -> DeviceAllocation:
    mem = Quantity.parse(memory)
    mem = Quantity.of(mem.value() * core // 100, Format.BINARY_SI)
    return DeviceAllocation(
        minor,
        {
            "koordinator.sh/gpu-core": Quantity.of(core),
            "koordinator.sh/gpu-memory": mem,
            "koordinator.sh/gpu-memory-ratio": Quantity.of(core),
        },
        id=uuid,
    )


def rdma_entry(minor: int, pf: str, vf: str | None, units: int = 1) -> DeviceAllocation:
    entry = DeviceAllocation(minor, {"koordinator.sh/rdma": Quantity.of(units)}, id=pf)
    if vf is not None:
        entry.vfs = [AllocatedVF(-1, vf)]
    return entry


def allocated(gpu: list[DeviceAllocation] | None = None, rdma: list[DeviceAllocation] | None = None) -> str:
    by_type: dict[str, list[DeviceAllocation]] = {}
    if gpu:
        by_type["gpu"] = gpu
    if rdma:
        by_type["rdma"] = rdma
    return DeviceAllocations(by_type).to_json()


def pod_doc(name: str, containers: dict[str, dict[str, str]], annotation: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if annotation is not None:
        meta["annotations"] = {keys.DEVICE_ALLOCATED: annotation}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": NODE,
            "schedulerName": "default-scheduler",
            "containers": [
                {"name": c, "image": "cuda", "resources": {"limits": dict(lim), "requests": dict(lim)}}
                for c, lim in containers.items()
            ],
        },
        "status": {"phase": "Pending"},
    }


@dataclass
class Rig:
    server: FakeApiServer
    api_client: Any
    fixture_name: str
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp")))
    agent: Agent | None = None
    fx: Fixture | None = None
    kubelet: StandInKubelet | None = None
    fixture_dir: Path | None = None  # a private copy to change; default hw-fixtures/<fixture_name>
    _loop: AgentLoop | None = None

    def __post_init__(self) -> None:
        self.plugin_dir = self.root / "dp"
        self.pr_socket = self.root / "pr.sock"
        self.dev = self.root / "dev"
        self.cdi = self.root / "cdi"
        self.state = self.root / "state"
        self.kubelet_config = self.root / "kubelet-config.yaml"
        for d in (self.dev, self.cdi, self.plugin_dir):
            d.mkdir(parents=True)
        for name in CONTROL:
            (self.dev / name).touch()
        self.server.put(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": NODE},
                "status": {"capacity": {"cpu": "64"}, "allocatable": {"cpu": "64"}},
            }
        )

    def start_kubelet(self) -> StandInKubelet:
        self.kubelet = StandInKubelet(self.plugin_dir, self.pr_socket).start()
        return self.kubelet

    def start_agent(
        self, *, wait: bool = True, wait_for: tuple[str, ...] = SERVED_RESOURCES, choose_on_node: bool = True
    ) -> Agent:
        """Start the agent (it serves every resource); wait until kubelet has `wait_for` registered.
        `choose_on_node` False: a pod without an allocation for this node is refused."""
        config = AgentConfig(resync_seconds=30)
        config.mid_tier.enabled = False
        config.kubelet.config_file = str(self.kubelet_config)  # kubelet's policies: none unless written
        config.health.event_wait_ms = 50
        self.fx = Fixture.load(self.fixture_dir or FIXTURES / self.fixture_name)
        kube = Kube(self.api_client)
        settings = DevicePluginSettings(
            plugin_dir=str(self.plugin_dir),
            pod_resources_socket=str(self.pr_socket),
            cdi_roots=(str(self.cdi),),
            dev_root=str(self.dev),
            host_dev=str(self.dev),
            state_dir=str(self.state),
            check_seconds=0.1,
            crosscheck_seconds=3600,  # tests run the cross-check themselves
            crosscheck_delay_seconds=3600,  # nor after a served Allocate: a background pass would race them
            choose_on_node=choose_on_node,
        )
        plugins = DevicePluginService(settings, node_name=NODE, sysfs_root=self.fx.sys_root, kube=kube)
        self.agent = Agent(
            node_name=NODE,
            nvml=self.fx.nvml,
            sysfs_root=self.fx.sys_root,
            config=config,
            kube=kube,
            device_plugins=plugins,
        )
        self._loop = AgentLoop(self.agent)
        if wait and self.kubelet is not None:
            self.kubelet.wait_registered(list(wait_for))
        return self.agent

    def stop_agent(self) -> None:
        if self._loop is not None:
            self._loop.stop()
        self._loop = None

    @property
    def plugins(self) -> DevicePluginService:
        assert self.agent is not None and isinstance(self.agent.device_plugins, DevicePluginService)
        return self.agent.device_plugins

    def uuid(self, minor: int) -> str:
        inv = self.plugins.admission.inventory
        gpu = inv.gpu_by_minor(minor)
        assert gpu is not None
        return gpu.uuid

    def put_pod(
        self, name: str, containers: dict[str, dict[str, str]], annotation: str | None
    ) -> dict[str, Any]:
        return self.server.put(pod_doc(name, containers, annotation))

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.server.list_objects("events") if e.get("reason") == reason]

    def close(self) -> None:
        self.stop_agent()
        if self.kubelet is not None:
            self.kubelet.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def exercise_device_plugins(server: FakeApiServer, api_client: Any) -> None:
    """Drive every API call the device plugins make (for the RBAC test): list pods, post a refusal
    Event, patch an annotation after a PodResources mismatch."""
    from tests.support.kubelet import AdmissionError

    rig = Rig(server, api_client, "dgx-h100")
    try:
        kubelet = rig.start_kubelet()
        rig.start_agent(wait_for=("nvidia.com/gpu",))
        bad = rig.put_pod("rbac-bad", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(9)]))
        try:
            kubelet.admit(bad)
        except AdmissionError:
            pass
        else:
            raise AssertionError("a pod annotated with a GPU the node lacks was admitted")
        rig.server.remove("pods", "rbac-bad", "default")
        kubelet.allocations["default/rbac-moved"] = {"main": {"nvidia.com/gpu": [rig.uuid(1)]}}
        rig.put_pod("rbac-moved", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(0)]))
        assert len(rig.plugins.checker.check()) == 1
    finally:
        rig.close()
