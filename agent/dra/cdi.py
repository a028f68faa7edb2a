"""CDI specs for prepared claims: one JSON file per claim under the CDI root, which the container
runtime reads when kubelet hands it the claim's CDI device IDs.

Kind `topoalloc.io/claim`; a device is named `<claim UID>-<device name>`, so an ID is unique per
claim (runtimes cache specs: a name reused by another claim could hit a stale entry). Each device
carries its device nodes: a GPU its `/dev/nvidia<minor>` and the control devices the host has; an
RDMA NIC or VF `/dev/infiniband/rdma_cm` and the `uverbsN` of its PCI function (found through
sysfs). The spec-wide edits carry the environment naming the claim's devices:
`NVIDIA_VISIBLE_DEVICES` (GPU UUIDs, for the NVIDIA runtime hook) and `PCIDEVICE_<class>` (PCI
addresses, the SR-IOV network device plugin's convention). They are per claim, not per device, so
that a claim with several GPUs lists them all (a variable set by several devices keeps only the
last value). A claim holding a share of a GPU (an allocation with a shareID that consumes less than
the whole) also gets HAMi-core's limits, as a shared GPU of the device plugins does
(`CUDA_DEVICE_MEMORY_LIMIT_<i>` per GPU of the claim, `CUDA_DEVICE_SM_LIMIT`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import host_paths
from agent.checkpoint import write_atomically
from agent.container_devices import GPU_CONTROL_DEVICES, RDMA_CM, gpu_node, hami_limits, pcidevice_env
from agent.discovery.sysfs import Sysfs
from apis import dra
from apis.device import DeviceInfo
from apis.resources import GPU_MEMORY

log = logging.getLogger(__name__)

CDI_VERSION = "0.6.0"
CDI_VENDOR = dra.DRIVER
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
DEFAULT_CDI_ROOT = host_paths.CDI_DYNAMIC
ENV_GPUS = "NVIDIA_VISIBLE_DEVICES"
ENV_NICS = pcidevice_env(dra.RDMA_CLASS)  # PCIDEVICE_RDMA_TOPOALLOC_IO
ENV_VFS = pcidevice_env(dra.RDMA_VF_CLASS)  # PCIDEVICE_RDMA_VF_TOPOALLOC_IO


class CdiError(Exception):
    """A device cannot be handed to a container (the message says why)."""


@dataclass(frozen=True)
class Resolved:
    """A device of a claim, found in the node's Device: its name, its entry, a VF's address."""

    name: dra.DeviceName
    info: DeviceInfo
    vf: str | None = None
    share: tuple[int, int] | None = None  # a GPU share's (memory bytes, cores); None: the whole GPU


def gpu_memory(info: DeviceInfo) -> int:
    """A GPU's memory in bytes (0 when the Device does not say)."""
    memory = info.resources.get(GPU_MEMORY)
    return memory.value() if memory is not None else 0


def whole_gpu(info: DeviceInfo) -> dict[str, int]:
    """What a whole GPU has to share: memory in bytes and cores in percent, by capacity name."""
    return {dra.CAPACITY_MEMORY: gpu_memory(info), dra.CAPACITY_CORES: dra.GPU_CORES}


def cdi_device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def cdi_device_id(claim_uid: str, device: str) -> str:
    """`topoalloc.io/claim=<claim UID>-gpu-3`: what kubelet passes to the runtime."""
    return f"{CDI_KIND}={cdi_device_name(claim_uid, device)}"


class ClaimSpecs:
    """Builds and writes the claims' specs. `dev_root` is where the agent sees the host's /dev (the
    control devices a host lacks are left out), `host_dev` the host's own path for it."""

    def __init__(
        self,
        root: str | Path,
        *,
        dev_root: str | Path = host_paths.DEV,
        host_dev: str = host_paths.DEV,
        sysfs_root: str | Path = host_paths.SYSFS,
    ) -> None:
        self.root = Path(root)
        self.dev_root = Path(dev_root)
        self.host_dev = host_dev.rstrip("/")
        self.sysfs = Sysfs(sysfs_root)

    def _node(self, rel: str) -> dict[str, str]:
        return {"path": f"/dev/{rel}", "hostPath": f"{self.host_dev}/{rel}"}

    def build(self, claim_uid: str, devices: list[Resolved]) -> dict[str, Any]:
        """The claim's spec. Raises CdiError when an RDMA function has no uverbs device."""
        controls = [c for c in GPU_CONTROL_DEVICES if (self.dev_root / c).exists()]
        verbs = self.sysfs.uverbs_by_function() if any(d.name.type != dra.TYPE_GPU for d in devices) else {}
        entries, gpus, nics, vfs = [], [], [], []
        limits: list[tuple[int, int]] = []  # (memory, cores) of each GPU, in NVIDIA_VISIBLE_DEVICES order
        for dev in devices:
            if dev.name.type == dra.TYPE_GPU:
                nodes = [self._node(gpu_node(dev.info.minor))] + [self._node(c) for c in controls]
                gpus.append(dev.info.id)
                limits.append(dev.share or (gpu_memory(dev.info), dra.GPU_CORES))
            else:
                function = dev.vf if dev.name.type == dra.TYPE_RDMA_VF else dev.info.id
                assert function is not None  # find_device gives every VF its address
                found = verbs.get(function, [])
                if not found:
                    raise CdiError(
                        f"RDMA function {function} ({dev.name}) has no uverbs device "
                        "(is its RDMA driver bound?)"
                    )
                nodes = [self._node(RDMA_CM)] + [self._node(f"infiniband/{v}") for v in found]
                (vfs if dev.name.type == dra.TYPE_RDMA_VF else nics).append(function)
            entries.append(
                {"name": cdi_device_name(claim_uid, str(dev.name)), "containerEdits": {"deviceNodes": nodes}}
            )
        env = [
            f"{key}={','.join(values)}"
            for key, values in ((ENV_GPUS, gpus), (ENV_NICS, nics), (ENV_VFS, vfs))
            if values
        ]
        spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": CDI_KIND}
        if any(dev.share is not None for dev in devices):
            # one SM limit for the container: the smallest share's, so no GPU gives more than granted
            hami = hami_limits([m for m, _ in limits], min(c for _, c in limits))
            env += [f"{key}={value}" for key, value in hami.items()]
        if env:
            spec["containerEdits"] = {"env": env}
        spec["devices"] = entries
        return spec

    def path(self, claim_uid: str) -> Path:
        """`<root>/topoalloc.io-claim_<uid>.json`: CDI's `<vendor>-<class>_<name>` file naming."""
        return self.root / f"{CDI_VENDOR}-{CDI_CLASS}_{claim_uid}.json"

    def write(self, claim_uid: str, spec: dict[str, Any]) -> None:
        """Raises OSError."""
        write_atomically(self.path(claim_uid), json.dumps(spec, indent=2).encode())

    def ensure(self, claim_uid: str, spec: dict[str, Any]) -> None:
        """Write the spec again if it is gone (the CDI root is on a tmpfs that a reboot empties)."""
        if not self.path(claim_uid).exists():
            log.info("CDI spec of claim %s was gone: written again", claim_uid)
            self.write(claim_uid, spec)

    def remove(self, claim_uid: str) -> None:
        self.path(claim_uid).unlink(missing_ok=True)
