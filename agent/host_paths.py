"""Every path of its node the agent opens, each named once: the code's defaults come from here, and
daemonset/daemonset.yaml mounts exactly these, read-only unless the agent writes there
(tests/deploy/test_agent_host_access.py holds the two together, so neither can grow alone).

/sys and /dev are mounted under /host (the container keeps its own); every other path is mounted
at the host's own path, since kubelet is told (or dials) the paths the agent names there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from apis import dra


@dataclass(frozen=True)
class HostPath:
    path: str  # on the node
    mount: str  # where the agent sees it
    writable: bool
    why: str


SYSFS: Final = "/sys"
DEV: Final = "/dev"
UDEV_RUN: Final = "/run/udev"
UDEV_CONTROL: Final = f"{UDEV_RUN}/control"
DEVICE_PLUGINS: Final = "/var/lib/kubelet/device-plugins"
POD_RESOURCES: Final = "/var/lib/kubelet/pod-resources"
POD_RESOURCES_SOCKET: Final = f"{POD_RESOURCES}/kubelet.sock"
KUBELET_CONFIG: Final = "/var/lib/kubelet/config.yaml"
CDI_STATIC: Final = "/etc/cdi"
CDI_DYNAMIC: Final = "/var/run/cdi"
STATE: Final = "/var/lib/topoalloc"
DRA_REGISTRY: Final = "/var/lib/kubelet/plugins_registry"
DRA_PLUGIN: Final = f"/var/lib/kubelet/plugins/{dra.DRIVER}"

HOST = "/host"  # where /sys and /dev of the node appear in the agent's container

HOST_PATHS: Final = (
    HostPath(SYSFS, HOST + SYSFS, False, "PCI, NUMA, NVLink, RDMA and SR-IOV topology; cgroups (mid-tier)"),
    HostPath(DEV, HOST + DEV, False, "device nodes checked before kubelet is told to hand them out"),
    HostPath(UDEV_RUN, UDEV_RUN, False, "udev's control socket and database: hot-plug events"),
    HostPath(DEVICE_PLUGINS, DEVICE_PLUGINS, True, "kubelet.sock and the device plugins' sockets"),
    HostPath(POD_RESOURCES, POD_RESOURCES, False, "kubelet's PodResources socket (the cross-check)"),
    HostPath(KUBELET_CONFIG, KUBELET_CONFIG, False, "kubelet's Topology and CPU manager policies"),
    HostPath(CDI_STATIC, CDI_STATIC, False, "the NVIDIA toolkit's CDI specs (device plugin)"),
    HostPath(CDI_DYNAMIC, CDI_DYNAMIC, True, "the CDI toolkit's specs, and the DRA plugin's per claim"),
    HostPath(STATE, STATE, True, "the agent's checkpoints"),
    HostPath(DRA_REGISTRY, DRA_REGISTRY, True, "the DRA plugin's registration socket"),
    HostPath(DRA_PLUGIN, DRA_PLUGIN, True, "the DRA plugin's socket, dialled by kubelet"),
)
