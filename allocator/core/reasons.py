"""Why a pod cannot go to a node: Koordinator's reason code plus a short sentence a person reads.

`code` is the string Koordinator's DeviceShare plugin would report for the same cause (protocol
section 10), so behaviour stays comparable; `message` is what we show as the per-node failure text,
in Events and in the CLI. Messages never carry pod names, node names or what one node has left
(free counts, switch names): kube-scheduler counts the nodes sharing a message under one reason, so
"need 9 free GPUs" is said once for every node short of them. What this node has is in `detail`,
shown where one node is looked at (`topoalloc allocate --explain`, a bind's Event): `explained`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rejection:
    code: str
    message: str
    # True when no preemption can cure it (kube-scheduler's UnschedulableAndUnresolvable).
    unresolvable: bool = False
    detail: str = ""  # this node's side of it ("2 are free"); never part of `message`

    def __str__(self) -> str:
        return self.message

    @property
    def explained(self) -> str:
        """The message with this node's detail: "need 4 free GPUs; 2 are free"."""
        return f"{self.message}; {self.detail}" if self.detail else self.message


# Koordinator's reason strings (protocol section 10). Types are spelled lowercase in them.
INVALID_UNIT = "invalid resource unit {name}: {quantity}"
INVALID_COMBINATION = "invalid resource device requests: [{names}]"
INVALID_HINT = "invalid DeviceAllocateHint annotation, err: {err}"
INVALID_SELECTOR = "invalid Selector of DeviceHint, deviceType: {type}, err: {err}"
INVALID_VF_SELECTOR = "invalid VFSelector of DeviceHint, deviceType: {type}, err: {err}"
INVALID_JOINT = "invalid DeviceJointAllocate annotation, err: {err}"
INVALID_PARTITION_SPEC = "invalid GPUPartitionSpec annotation, err: {err}"
ISOLATION_PROVIDER = "GPUIsolationProviderHAMICore not found on the node"
INSUFFICIENT_DEVICES = "Insufficient {type} devices"
INSUFFICIENT_VFS = "Insufficient {type} VirtualFunctions"
INSUFFICIENT_PRIMARY = "node(s) Insufficient primary device"
JOINT_VIOLATION = "node(s) Device Joint-Allocate rules violation"
MISSING_PARTITION_TABLE = "node(s) missing GPU Partition Table"
UNSUPPORTED_GPU_COUNT = "node(s) Unsupported number of GPU requests"
INSUFFICIENT_PARTITIONS = "Insufficient Partitioned GPU Devices"
MISSING_TOPOLOGY_TREE = "node(s) missing GPU Device Topology Tree"
UNSUPPORTED_MULTI_SHARED = "node(s) Unsupported Multi-Shared GPU"
INSUFFICIENT_SCOPED = "Insufficient Topology Scoped GPU Devices"
INSUFFICIENT_NUMA = "Insufficient NUMA Scoped Devices"
# topoalloc's own codes, for causes Koordinator does not reject (see docs/compatibility.md).
NO_DEVICE_CR = "topoalloc: node has no Device"
UNSATISFIABLE_DEVICE_SCOPE = "topoalloc: Device scope holds one GPU"
INVALID_POD = "topoalloc: invalid pod"


def invalid(code: str, message: str) -> Rejection:
    """A request that can never be scheduled as written (bad annotation, bad resources)."""
    return Rejection(code, message, unresolvable=True)


def plural(count: int, word: str, many: str | None = None) -> str:
    return f"{count} {word if count == 1 else (many or word + 's')}"
