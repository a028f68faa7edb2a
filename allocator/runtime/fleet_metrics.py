"""Metrics about the cluster as the watch cache sees it, computed at scrape time (the request path
pays nothing): GPUs per node pool (allocated, free, stranded), multi-GPU pods by whether their GPUs
share one NVLink domain, the hold ledger's holds, pods waiting at topoalloc's scheduling gates and
how long, and when each node's agent last refreshed its Device.

A node's pool is the first of POOL_LABELS it carries (the cloud providers' pool labels, then the
instance type), else "none". Every replica's cache is the same, so dashboards and alerts take
`max` over replicas.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from allocator.runtime.cache.store import ClusterCache
from apis import keys
from apis.resources import node_gpus
from apis.timestamps import parse_time

POOL_LABELS = (
    keys.NODE_POOL,  # set by hand to name pools the others do not
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
    "kubernetes.azure.com/agentpool",
    "node.kubernetes.io/instance-type",
)
NO_POOL = "none"
# What the ledger holds for (`hold_kind`), each always reported (0 included).
HOLD_KINDS = ("bind", "gang", "reservation", "placement", "ahead", "claims")


def pool_of(labels: Mapping[str, str]) -> str:
    return next((str(labels[k]) for k in POOL_LABELS if labels.get(k)), NO_POOL)


def hold_kind(key: str, holder: str) -> str:
    """What a ledger entry holds for: bind, gang, reservation, placement, ahead, claims."""
    if key.startswith("admission:"):
        return "ahead"
    if not holder:
        return "bind"
    return "gang" if "/" in holder else holder


class FleetCollector(Collector):
    def __init__(self, cache: ClusterCache, *, now: Callable[[], float] = time.time) -> None:
        self.cache = cache
        self.now = now

    def collect(self) -> Iterable[GaugeMetricFamily]:
        yield from self._pools()
        yield self._multi_gpu_pods()
        yield self._holds()
        yield from self._gated()
        yield self._device_updates()

    def _pools(self) -> Iterable[GaugeMetricFamily]:
        taken = {node: n for node, dtype, n in self.cache.allocated_devices() if dtype == "gpu"}
        gpus = GaugeMetricFamily(
            "topoalloc_pool_gpus",
            "GPUs of the nodes of a pool, by state: allocated or free.",
            labels=["pool", "state"],
        )
        stranded = GaugeMetricFamily(
            "topoalloc_pool_gpus_stranded",
            "Free GPUs on nodes of the pool that also have GPUs allocated: room a whole-node job cannot use.",
            labels=["pool"],
        )
        totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # allocated, free, stranded
        for name, facts in self.cache.nodes.items():
            count = node_gpus(facts.allocatable)
            if count <= 0:
                continue
            used = min(taken.get(name, 0), count)
            row = totals[pool_of(facts.labels)]
            row[0] += used
            row[1] += count - used
            if used:
                row[2] += count - used
        for pool, (used, free, idle) in sorted(totals.items()):
            gpus.add_metric([pool, "allocated"], used)
            gpus.add_metric([pool, "free"], free)
            stranded.add_metric([pool], idle)
        yield gpus
        yield stranded

    def _multi_gpu_pods(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "topoalloc_multi_gpu_pods",
            "Bound pods holding two or more GPUs of a node, by link: nvlink (all in one NVLink domain) "
            "or other.",
            labels=["link"],
        )
        counts = {"nvlink": 0, "other": 0}
        for entry in self.cache.pods.values():
            allocations = entry.allocations if entry.holds else None
            gpus = [a.minor for a in (allocations.by_type.get("gpu", ()) if allocations else ())]
            if len(set(gpus)) < 2:
                continue
            shared = self.cache.core.share_nvlink(entry.node, gpus)
            if shared is not None:
                counts["nvlink" if shared else "other"] += 1
        for link, n in counts.items():
            family.add_metric([link], n)
        return family

    def _holds(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "topoalloc_holds",
            "Entries of the hold ledger (devices held beyond what bound pods say), by what they hold for.",
            labels=["kind"],
        )
        counts: dict[str, int] = dict.fromkeys(HOLD_KINDS, 0)
        for key, hold in self.cache.ledger.holds.items():
            kind = hold_kind(key, hold.holder)
            counts[kind] = counts.get(kind, 0) + 1
        for kind, n in sorted(counts.items()):
            family.add_metric([kind], n)
        return family

    def _gated(self) -> Iterable[GaugeMetricFamily]:
        pods = GaugeMetricFamily(
            "topoalloc_gated_pods",
            "Pods not bound yet that carry a topoalloc scheduling gate.",
            labels=["gate"],
        )
        oldest = GaugeMetricFamily(
            "topoalloc_gated_pods_oldest_seconds",
            "Age of the oldest pod carrying a topoalloc scheduling gate.",
            labels=["gate"],
        )
        now = self.now()
        count: dict[str, int] = defaultdict(int)
        age: dict[str, float] = defaultdict(float)
        for entry in self.cache.pods.values():
            raw = entry.raw
            if raw is None or entry.node or not entry.active:
                continue
            created = parse_time((raw.get("metadata") or {}).get("creationTimestamp"))
            for gate in (raw.get("spec") or {}).get("schedulingGates") or ():
                name = gate.get("name") if isinstance(gate, dict) else None
                if not isinstance(name, str) or not name.startswith(keys.TOPOALLOC):
                    continue
                count[name] += 1
                if created is not None:
                    age[name] = max(age[name], now - created)
        for gate in sorted(count):
            pods.add_metric([gate], count[gate])
            oldest.add_metric([gate], age[gate])
        yield pods
        yield oldest

    def _device_updates(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "topoalloc_device_update_timestamp_seconds",
            "When the node's agent last wrote its Device (status.updateTime), seconds since the epoch.",
            labels=["node"],
        )
        for name, record in sorted(self.cache.devices.items()):
            at = parse_time(record.updated)
            if at is not None:
                family.add_metric([name], at)
        return family
