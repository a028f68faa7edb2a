"""What a pod says that topoalloc would otherwise ignore without a word, said in one sentence each.

- An annotation key with Koordinator's (`scheduling.koordinator.sh/`) or topoalloc's
  (`topoalloc.io/`) prefix that no reader knows: `device-joint-alocate` is ignored, so the pod gets
  one NIC instead of a NIC per GPU. The sentence names the closest known key when there is one.
- A resource name close to a device resource topoalloc allocates but not one (`nvida.com/gpu`,
  `nvidia.com/GPU`): the pod would get no GPU from topoalloc, and no device plugin serves the name.

Every reader of a pod says the same sentences (docs/cli.md, "Silent mistakes"): the extender as one
Warning Event per pod, the admission webhooks as admission warnings (`kubectl` prints them), the
agent as one Event per pod it serves, `topoalloc allocate` on stderr (`--strict`: an error).
Pure and cheap: a key or name is compared only when it is not a known one.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from apis import dra, dra_taints, keys, kubelet_policy, topology_profile
from apis import reservation as rv
from apis import reservation_pod as rp
from apis.resources import RESOURCE_DEVICE_TYPE

CHECKED_PREFIXES = (keys.SCHED, keys.TOPOALLOC)
EVENT_REASON = "IgnoredPodSettings"  # the Warning Event's reason, wherever one is written

# Every key with those prefixes that topoalloc reads or writes on any object (a pod carrying a
# Device's or a Node's key is odd, but not a typo; tests/apis/test_pod_checks.py finds each one the
# product names), and Koordinator's pod annotations that topoalloc leaves to Koordinator (not
# warned: pods written for Koordinator must pass unchanged).
KNOWN_KEYS = frozenset(
    {
        keys.DEVICE_ALLOCATED,
        keys.DEVICE_ALLOCATE_HINT,
        keys.DEVICE_JOINT_ALLOCATE,
        keys.GPU_PARTITION_SPEC,
        keys.NUMA_TOPOLOGY_SPEC,
        keys.GPU_PARTITIONS,
        rp.RESERVATION_ALLOCATED,
        rp.RESERVATION_AFFINITY,
        rp.EXACT_MATCH,
        rp.RESERVATION_IGNORED,
        rp.RESERVATION_ORDER,
        rp.RESOURCE_STATUS,
        keys.SCHED + "resource-spec",
        keys.SCHED + "bind-timestamp",
        keys.SCHED + "gpu-minors",
        keys.SCHED + "soft-eviction",
        keys.GANG_SCHEDULING_GATE,
        keys.GANG_PLANNED_NODE,
        keys.GANG_HOLD,
        keys.SCARCE_AVOIDANCE,
        keys.NODE_POOL,  # a Node label (fleet metrics)
        keys.AGENT_POOL,  # a Node label (the agent pool a node is in)
        keys.ALLOCATED_NODE,
        keys.NUDGED,
        keys.PLACEMENT_GATE,  # also the opt-out label's key (keys.PLACEMENT)
        keys.TOPOALLOC + "Placed",  # placement's pod condition type
        keys.REQUIRED_TOPOLOGY,
        keys.PREFERRED_TOPOLOGY,
        dra.SCHEDULING_GATE,
        dra.MODE_LABEL,
        dra.ALLOCATOR_ANNOTATION,
        dra.ALLOCATED_BY_ANNOTATION,
        dra.ANNOUNCES_ANNOTATION,  # the allocator's own claims that keep a device counted
        dra_taints.UNHEALTHY_KEY,  # an unhealthy device's taint, tolerated by a claim's request
        rv.GANG,
        rv.GANG_SIZE,
        kubelet_policy.TOPOLOGY_MANAGER_SCOPE,
        kubelet_policy.CPU_MANAGER_POLICY,
        kubelet_policy.NUMA_CPUS,
        topology_profile.RACK,
        keys.TOPOALLOC + "gpu-node",  # the installer's node label
        keys.TOPOALLOC + "leader",  # the allocator's leader pod label
        # the migration controller's Reservations (allocator/defrag/reading.py)
        *(keys.TOPOALLOC + f"defrag{part}" for part in ("", "-pod", "-pod-uid", "-source", "-target")),
        *(keys.TOPOALLOC + f"defrag-{part}" for part in ("workload", "unblocks", "evicted", "closed")),
    }
)
# Real resources of a vendor's own plugin that are close to one topoalloc allocates: not typos.
OTHER_PLUGINS_RESOURCES = frozenset({"nvidia.com/gpu.shared"})
CUTOFF = 0.85  # difflib ratio: `nvida.com/gpu` 0.96, `nvidia.com/gpu.shared` 0.80 (a real name)
_MANAGED = tuple(RESOURCE_DEVICE_TYPE)
_MANAGED_FOLDED = {name.casefold(): name for name in _MANAGED}


def annotation_warnings(annotations: Mapping[str, Any]) -> list[str]:
    """A sentence per annotation key of a checked prefix that is not a known key."""
    out = []
    for key in sorted(k for k in annotations if isinstance(k, str)):
        if not key.startswith(CHECKED_PREFIXES) or key in KNOWN_KEYS:
            continue
        prefix = next(p for p in CHECKED_PREFIXES if key.startswith(p))
        # Names compared without their shared prefix, which would make any two look alike.
        known = sorted(k.removeprefix(prefix) for k in KNOWN_KEYS if k.startswith(prefix))
        close = difflib.get_close_matches(key.removeprefix(prefix), known, 1, 0.8)
        if close:
            out.append(f"unknown annotation {key} (did you mean {prefix}{close[0]}?): topoalloc ignores it")
        else:
            out.append(f"unknown annotation {key}: topoalloc ignores it")
    return out


def near_miss(name: str) -> str | None:
    """The device resource `name` is most likely a typo of, or None."""
    if name in RESOURCE_DEVICE_TYPE or name in OTHER_PLUGINS_RESOURCES or "/" not in name:
        return None
    folded = _MANAGED_FOLDED.get(name.casefold())
    if folded is not None:
        return folded
    close = difflib.get_close_matches(name, _MANAGED, 1, CUTOFF)
    return close[0] if close else None


def resource_warnings(names: Iterable[str]) -> list[str]:
    """A sentence per resource name that is a near miss of one topoalloc allocates."""
    out = []
    for name in sorted(set(names)):
        close = near_miss(name)
        if close is not None:
            out.append(f"unknown resource {name} (did you mean {close}?): topoalloc allocates nothing for it")
    return out


def resource_names(pod: Mapping[str, Any]) -> set[str]:
    """Every resource name the pod's containers (and init containers) request or limit."""
    spec = pod.get("spec")
    names: set[str] = set()
    if not isinstance(spec, dict):
        return names
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        for container in containers if isinstance(containers, list) else ():
            resources = container.get("resources") if isinstance(container, dict) else None
            for part in ("limits", "requests"):
                table = resources.get(part) if isinstance(resources, dict) else None
                if isinstance(table, dict):
                    names.update(str(n) for n in table)
    return names


def pod_warnings(pod: Any) -> list[str]:
    """Everything above about one Pod object (a malformed one: nothing; its readers refuse it)."""
    if not isinstance(pod, dict):
        return []
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    out = annotation_warnings(annotations) if isinstance(annotations, dict) else []
    return out + resource_warnings(resource_names(pod))
