"""What a container is given for its devices: CDI names, or device nodes plus environment.

GPUs: the CDI names when every GPU has one in a CDI spec (`NVIDIA_VISIBLE_DEVICES=void` then keeps
an NVIDIA runtime hook from adding GPUs on its own, e.g. for a CUDA image's `=all`), otherwise
`/dev/nvidia<minor>` with the control devices that exist and `NVIDIA_VISIBLE_DEVICES=<uuids>`.
Shared GPUs (`gpu-core` or `koordinator.sh/gpu` below 100) also get HAMi-core's limits:
`CUDA_DEVICE_MEMORY_LIMIT_<i>` (MiB, HAMi's `m` suffix) per GPU of the container and
`CUDA_DEVICE_SM_LIMIT` (percent).
RDMA: `/dev/infiniband/rdma_cm` and the `uverbsN` of each chosen VF (the PF when the entry has no
VF), found through sysfs `infiniband_verbs`, and `PCIDEVICE_<RESOURCE>` with those PCI addresses,
the SR-IOV network device plugin's convention that SR-IOV CNI and Multus read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent import host_paths
from agent.container_devices import GPU_CONTROL_DEVICES, RDMA_CM, gpu_node, hami_limits, pcidevice_env
from agent.deviceplugin.cdi import CdiRegistry
from agent.deviceplugin.expectation import ContainerExpectation, ExpectationError
from agent.deviceplugin.inventory import GPU_SHARE_RESOURCES, Inventory
from agent.discovery.sysfs import Sysfs
from apis import resources as rn


@dataclass(frozen=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass
class Grant:
    envs: dict[str, str] = field(default_factory=dict)
    devices: list[DeviceNode] = field(default_factory=list)
    cdi_devices: list[str] = field(default_factory=list)


class GrantBuilder:
    """`dev_root` is where the agent sees the host's /dev (the DaemonSet mounts it at /host/dev);
    `host_dev` is the host's own path for it, which is what kubelet is told."""

    def __init__(
        self,
        *,
        cdi: CdiRegistry,
        dev_root: str | Path = host_paths.DEV,
        host_dev: str = host_paths.DEV,
        sysfs_root: str | Path = host_paths.SYSFS,
    ) -> None:
        self.dev_root = Path(dev_root)
        self.host_dev = host_dev.rstrip("/")
        self.sysfs = Sysfs(sysfs_root)
        self.cdi = cdi

    def _node(self, rel: str) -> DeviceNode:
        return DeviceNode(f"/dev/{rel}", f"{self.host_dev}/{rel}")

    def build(self, resource: str, exp: ContainerExpectation, inv: Inventory) -> Grant:
        if resource == rn.RDMA:
            return self._rdma(resource, exp)
        return self._gpu(resource, exp, inv)

    def _gpu(self, resource: str, exp: ContainerExpectation, inv: Inventory) -> Grant:
        gpus = []
        for uuid in exp.bases:
            gpu = inv.gpu_by_uuid(uuid)
            assert gpu is not None  # expectations() checked every base against the inventory
            gpus.append(gpu)
        grant = Grant()
        names = self.cdi.gpu_names([(g.minor, g.uuid) for g in gpus])
        if names is not None:
            grant.cdi_devices = names
            grant.envs["NVIDIA_VISIBLE_DEVICES"] = "void"
        else:
            grant.devices = [self._node(gpu_node(g.minor)) for g in gpus]
            grant.devices += [self._node(c) for c in GPU_CONTROL_DEVICES if (self.dev_root / c).exists()]
            grant.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(g.uuid for g in gpus)
        if resource in GPU_SHARE_RESOURCES:
            cores = [(e.resources or {}).get(rn.GPU_CORE) for e in exp.entries]
            if any(c is not None and c.value() < 100 for c in cores):
                memories = []
                for entry in exp.entries:
                    memory = (entry.resources or {}).get(rn.GPU_MEMORY)
                    if memory is None:
                        raise ExpectationError(f"shared GPU {entry.minor}: the annotation has no gpu-memory")
                    memories.append(memory.value())
                first = cores[0]
                assert first is not None  # _units() required gpu-core on every gpu-core entry
                grant.envs.update(hami_limits(memories, first.value()))
        return grant

    def _rdma(self, resource: str, exp: ContainerExpectation) -> Grant:
        grant = Grant(devices=[self._node(RDMA_CM)])
        functions: list[str] = []
        for entry, pf in zip(exp.entries, exp.bases, strict=True):
            functions.extend([vf.bus_id for vf in entry.vfs] or [pf])
        by_function = self.sysfs.uverbs_by_function()
        for bdf in functions:
            verbs = by_function.get(bdf, [])
            if not verbs:
                raise ExpectationError(
                    f"RDMA function {bdf} has no uverbs device (is its RDMA driver bound?)"
                )
            grant.devices += [self._node(f"infiniband/{v}") for v in verbs]
        grant.envs[pcidevice_env(resource)] = ",".join(functions)
        return grant
