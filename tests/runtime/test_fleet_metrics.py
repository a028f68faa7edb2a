"""The allocator's scrape-time metrics of the cluster (allocator/runtime/fleet_metrics.py), read
from a watch cache fed event by event into the real core: GPUs per node pool, stranded GPUs,
multi-GPU pods on one NVLink domain or not, holds, gated pods and their age, Device refresh times."""

from __future__ import annotations

import copy
from typing import Any

from prometheus_client import CollectorRegistry

from allocator.runtime.cache.store import ClusterCache
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.fleet_metrics import FleetCollector, hold_kind
from allocator.runtime.kube import DEVICES, NODES, PODS
from apis.timestamps import format_time, parse_time
from tests.runtime.test_store import bound, stamped
from tests.support.allocator_harness import device, node, pod

NOW = 1_800_000_000.0
POOL = "cloud.google.com/gke-nodepool"


def scrape(cache: ClusterCache) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(FleetCollector(cache, now=lambda: NOW))
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def with_update_time(dev: dict[str, Any], at: float) -> dict[str, Any]:
    dev = copy.deepcopy(dev)
    dev.setdefault("status", {})["updateTime"] = format_time(at)
    return dev


def cluster() -> ClusterCache:
    cache = ClusterCache(CoreAdapter())
    for name, kind, labels in (
        ("h100-a", "dgx-h100", {POOL: "train"}),
        ("h100-b", "dgx-h100", {POOL: "train"}),
        ("l40s-a", "l40s", {"node.kubernetes.io/instance-type": "g6e.48xlarge"}),
    ):
        cache.apply(NODES, "ADDED", stamped(node(name, labels=labels)))
        cache.apply(DEVICES, "ADDED", stamped(with_update_time(device(name, kind), NOW - 60)))
    return cache


def test_pools_count_allocated_free_and_stranded_gpus() -> None:
    cache = cluster()
    cache.apply(PODS, "ADDED", bound("four", "h100-a", [0, 1, 2, 3]))
    cache.apply(PODS, "ADDED", bound("pair", "l40s-a", [0, 1]))
    got = scrape(cache)
    assert got[("topoalloc_pool_gpus", (("pool", "train"), ("state", "allocated")))] == 4
    assert got[("topoalloc_pool_gpus", (("pool", "train"), ("state", "free")))] == 12
    # the 4 free GPUs of h100-a are stranded; h100-b's 8 are a whole free node
    assert got[("topoalloc_pool_gpus_stranded", (("pool", "train"),))] == 4
    assert got[("topoalloc_pool_gpus", (("pool", "g6e.48xlarge"), ("state", "allocated")))] == 2
    assert got[("topoalloc_pool_gpus_stranded", (("pool", "g6e.48xlarge"),))] == 6


def test_multi_gpu_pods_by_whether_their_gpus_share_nvlink() -> None:
    cache = cluster()
    cache.apply(PODS, "ADDED", bound("nvswitch", "h100-a", [0, 5]))  # one NVSwitch domain
    cache.apply(PODS, "ADDED", bound("pcie", "l40s-a", [0, 1]))  # no NVLink on an L40S
    cache.apply(PODS, "ADDED", bound("single", "h100-b", [2]))  # one GPU: not counted
    got = scrape(cache)
    assert got[("topoalloc_multi_gpu_pods", (("link", "nvlink"),))] == 1
    assert got[("topoalloc_multi_gpu_pods", (("link", "other"),))] == 1


def test_gated_pods_and_the_age_of_the_oldest() -> None:
    cache = cluster()
    for name, age, gates in (("old", 1200, ["topoalloc.io/placement"]), ("new", 30, ["topoalloc.io/placement"]),
                             ("gang", 90, ["topoalloc.io/gang"]), ("foreign", 5000, ["example.com/wait"])):  # fmt: skip
        p = stamped(pod(name, gpus=1), creationTimestamp=format_time(NOW - age))
        p["spec"]["schedulingGates"] = [{"name": g} for g in gates]
        cache.apply(PODS, "ADDED", p)
    got = scrape(cache)
    assert got[("topoalloc_gated_pods", (("gate", "topoalloc.io/placement"),))] == 2
    assert got[("topoalloc_gated_pods_oldest_seconds", (("gate", "topoalloc.io/placement"),))] == 1200
    assert got[("topoalloc_gated_pods_oldest_seconds", (("gate", "topoalloc.io/gang"),))] == 90
    assert not any(labels == (("gate", "example.com/wait"),) for _n, labels in got)


def test_each_devices_refresh_time_and_a_stale_one() -> None:
    cache = cluster()
    cache.apply(DEVICES, "MODIFIED", stamped(with_update_time(device("h100-b"), NOW - 3600)))
    got = scrape(cache)
    assert got[("topoalloc_device_update_timestamp_seconds", (("node", "h100-a"),))] == parse_time(
        format_time(NOW - 60)
    )
    assert NOW - got[("topoalloc_device_update_timestamp_seconds", (("node", "h100-b"),))] == 3600


def test_holds_by_kind_every_kind_reported() -> None:
    cache = cluster()
    req = cache.core.request(pod("p", gpus=2))
    held = cache.ledger.reserve(stamped(pod("p", gpus=2)), req, "h100-a")
    assert not hasattr(held, "code")  # a Hold, not a Rejection
    got = scrape(cache)
    assert got[("topoalloc_holds", (("kind", "bind"),))] == 1
    assert {labels[0][1] for name, labels in got if name == "topoalloc_holds"} >= {
        "bind",
        "gang",
        "reservation",
        "placement",
        "ahead",
        "claims",
    }
    assert [
        hold_kind("admission:3", "placement"),
        hold_kind("ns/gang", "ns/gang"),
        hold_kind("k", "claims"),
    ] == ["ahead", "gang", "claims"]
