"""Annotation and label keys of the contract (protocol sections 1.3 and 1.4), plus gang keys."""

from __future__ import annotations

SCHED = "scheduling.koordinator.sh/"
NODE = "node.koordinator.sh/"

# Pod annotations
DEVICE_ALLOCATED = SCHED + "device-allocated"
DEVICE_ALLOCATE_HINT = SCHED + "device-allocate-hint"
DEVICE_JOINT_ALLOCATE = SCHED + "device-joint-allocate"
GPU_PARTITION_SPEC = SCHED + "gpu-partition-spec"
NUMA_TOPOLOGY_SPEC = SCHED + "numa-topology-spec"

# Device CR annotation
GPU_PARTITIONS = SCHED + "gpu-partitions"

# Device CR / Node labels
GPU_PARTITION_POLICY = NODE + "gpu-partition-policy"
GPU_VENDOR = NODE + "gpu-vendor"
GPU_MODEL = NODE + "gpu-model"
GPU_DRIVER_VERSION = NODE + "gpu-driver-version"
SECONDARY_DEVICE_WELL_PLANNED = NODE + "secondary-device-well-planned"

# Pod and Node label
GPU_ISOLATION_PROVIDER = "koordinator.sh/gpu-isolation-provider"
HAMI_CORE = "HAMi-core"

# Gang membership (scheduler-plugins PodGroup and Koordinator's PodGroup-less gangs)
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
POD_GROUP_LABEL_LEGACY = "pod-group.scheduling.sigs.k8s.io/name"
GANG_NAME = "gang.scheduling.koordinator.sh/name"
GANG_MIN_AVAILABLE = "gang.scheduling.koordinator.sh/min-available"
GANG_WAITING_TIME = "gang.scheduling.koordinator.sh/waiting-time"  # a Go duration, e.g. "600s"

# topoalloc's own keys
TOPOALLOC = "topoalloc.io/"
RL_JOB_GROUP = "rl-job-group"
GANG_SCHEDULING_GATE = TOPOALLOC + "gang"
GANG_PLANNED_NODE = TOPOALLOC + "gang-planned-node"  # set on a member released without its gate
# Beside device-allocated: the node that allocation was made for (a pod may be bound elsewhere than
# where it was placed). Absent: made for the node the pod is bound to (docs/compatibility.md).
ALLOCATED_NODE = TOPOALLOC + "allocated-node"
# On a member whose gang holds room while victims leave: the hold, so a new leader continues it.
GANG_HOLD = TOPOALLOC + "gang-hold"
# On a pod kube-scheduler holds as unschedulable, when room it fits was freed: why and when (the
# write itself makes kube-scheduler try the pod again now, allocator/runtime/nudge.py).
NUDGED = TOPOALLOC + "nudged"
# On a pod or its namespace, "false": no preference away from GPU nodes (docs/service.md).
SCARCE_AVOIDANCE = TOPOALLOC + "scarce-avoidance"
# A Node label naming its pool for the fleet metrics, where no cloud's pool label does.
NODE_POOL = TOPOALLOC + "node-pool"
# The Node label that puts a node in one of the chart's or installer's agent pools (docs/helm.md).
AGENT_POOL = TOPOALLOC + "agent-pool"
# Placement mode (docs/placement.md): the gate a GPU pod is created with until its node and devices
# are chosen (it records them with ALLOCATED_NODE); "false" on a pod (label) or its namespace:
# placement leaves it alone.
PLACEMENT_GATE = TOPOALLOC + "placement"
PLACEMENT = TOPOALLOC + "placement"

# Topology levels a gang or an RL job group keeps to (docs/topology.md): the value is a node label
# key (or a level's name in the allocator's topology profile).
REQUIRED_TOPOLOGY = TOPOALLOC + "required-topology"
PREFERRED_TOPOLOGY = TOPOALLOC + "preferred-topology"
# Kueue's pod-set annotations (Topology-Aware Scheduling), read for users coming from Kueue.
KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
KUEUE_UNCONSTRAINED_TOPOLOGY = "kueue.x-k8s.io/podset-unconstrained-topology"
