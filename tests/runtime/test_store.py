"""The watch cache's rules, fed event by event into the real core (no API server needed)."""

from __future__ import annotations

import copy
from typing import Any

from allocator.runtime.cache.store import ClusterCache
from allocator.runtime.coreadapter import CoreAdapter
from allocator.runtime.kube import DEVICES, NODES, PODS
from apis import keys
from tests.support.allocator_harness import device, node, pod

_rv = iter(range(1, 10**6))


def stamped(obj: dict[str, Any], **meta: Any) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"].setdefault("uid", f"uid-{obj['metadata']['name']}")
    obj["metadata"].update(meta)
    obj["metadata"]["resourceVersion"] = str(next(_rv))
    return obj


def cache_with(*names: str) -> ClusterCache:
    cache = ClusterCache(CoreAdapter())
    for name in names:
        cache.apply(NODES, "ADDED", stamped(node(name)))
        cache.apply(DEVICES, "ADDED", stamped(device(name)))
    return cache


def fits(cache: ClusterCache, gpus: int, name: str) -> bool:
    req = cache.core.request(pod(f"probe-{gpus}", gpus=gpus))
    return cache.core.filter_each(req, [name])[0] == [name]


def bound(name: str, node_name: str, gpus: list[int]) -> dict[str, Any]:
    p = stamped(pod(name, gpus=len(gpus), node_name=node_name))
    alloc = {"gpu": [{"minor": m, "resources": {"koordinator.sh/gpu-core": "100",
                                                 "koordinator.sh/gpu-memory-ratio": "100"}} for m in gpus]}  # fmt: skip
    p["metadata"]["annotations"] = {keys.DEVICE_ALLOCATED: __import__("json").dumps(alloc)}
    return p


def test_node_deleted_and_created_again_gets_its_devices_back() -> None:
    cache = cache_with("gpu-1")
    assert fits(cache, 8, "gpu-1")
    cache.apply(NODES, "DELETED", stamped(node("gpu-1")))
    assert not fits(cache, 1, "gpu-1")
    cache.apply(NODES, "ADDED", stamped(node("gpu-1")))  # the Device CR never changed
    assert fits(cache, 8, "gpu-1")


def test_a_relist_replaying_a_device_cr_rebuilds_nothing() -> None:
    cache = ClusterCache(CoreAdapter())
    dev = stamped(device("gpu-1"))
    cache.replace(DEVICES, [dev])
    record = cache.devices["gpu-1"]
    cache.replace(DEVICES, [copy.deepcopy(dev)])  # the same resourceVersion again
    assert cache.devices["gpu-1"] is record
    changed = stamped(dev)  # a new resourceVersion
    cache.replace(DEVICES, [changed])
    assert cache.devices["gpu-1"].resource_version == changed["metadata"]["resourceVersion"]


def test_pods_seen_before_their_node_count_once_it_arrives() -> None:
    cache = ClusterCache(CoreAdapter())
    cache.apply(PODS, "ADDED", bound("early", "gpu-1", [0, 1, 2, 3]))
    cache.apply(DEVICES, "ADDED", stamped(device("gpu-1")))
    cache.apply(NODES, "ADDED", stamped(node("gpu-1")))
    assert fits(cache, 4, "gpu-1") and not fits(cache, 5, "gpu-1")


def test_finished_deleted_and_replaced_pods_release_their_devices() -> None:
    cache = cache_with("gpu-1")
    p = bound("job", "gpu-1", list(range(8)))
    cache.apply(PODS, "ADDED", p)
    assert not fits(cache, 1, "gpu-1")
    done = stamped(p)
    done["status"] = {"phase": "Succeeded"}
    cache.apply(PODS, "MODIFIED", done)
    assert fits(cache, 8, "gpu-1")
    cache.apply(PODS, "MODIFIED", stamped(p))  # (a test-only resurrection) counted again
    assert not fits(cache, 1, "gpu-1")
    # Same name, new uid: the old pod is gone and the new one is pending.
    cache.apply(PODS, "ADDED", stamped(pod("job", gpus=8), uid="another-uid"))
    assert fits(cache, 8, "gpu-1")
    assert cache.holdings() == {}


def test_malformed_annotation_counts_without_devices() -> None:
    cache = cache_with("gpu-1")
    p = bound("odd", "gpu-1", [0])
    p["metadata"]["annotations"][keys.DEVICE_ALLOCATED] = "{not json"
    cache.apply(PODS, "ADDED", p)
    assert fits(cache, 8, "gpu-1")
    assert cache.pod("default", "odd").usage.error


def test_an_annotation_made_for_another_node_counts_nothing_until_rewritten() -> None:
    """kube-scheduler bound the pod elsewhere than it was placed: its devices are not taken on the
    node it runs on until that node's agent writes what it chose (allocated-node names it)."""
    cache = cache_with("gpu-1", "gpu-2")
    p = bound("moved", "gpu-1", list(range(8)))
    p["metadata"]["annotations"][keys.ALLOCATED_NODE] = "gpu-2"
    cache.apply(PODS, "ADDED", p)
    assert fits(cache, 8, "gpu-1") and fits(cache, 8, "gpu-2")
    assert cache.pods["default/moved"].allocations is None
    chosen = stamped(p)  # the agent on gpu-1 writes its own choice, naming its node
    chosen["metadata"]["annotations"][keys.ALLOCATED_NODE] = "gpu-1"
    cache.apply(PODS, "MODIFIED", chosen)
    assert not fits(cache, 1, "gpu-1") and fits(cache, 8, "gpu-2")
    assert cache.pods["default/moved"].allocations.minors("gpu") == list(range(8))  # type: ignore[union-attr]
    # the same key naming the pod's own node, or no key at all: counted as before
    plain = stamped(bound("plain", "gpu-2", [0, 1]))
    cache.apply(PODS, "ADDED", plain)
    assert not fits(cache, 8, "gpu-2") and fits(cache, 4, "gpu-2")
    assert cache.pods["default/plain"].allocations.minors("gpu") == [0, 1]  # type: ignore[union-attr]


def test_invalid_device_cr_is_a_reason_until_fixed() -> None:
    cache = cache_with("gpu-1")
    broken = stamped(device("gpu-1"))
    broken["spec"]["devices"][0]["minor"] = "zero"
    cache.apply(DEVICES, "MODIFIED", broken)
    assert "gpu-1" in cache.core.device_errors
    req = cache.core.request(pod("p", gpus=1))
    passed, failed = cache.core.filter_each(req, ["gpu-1"])
    assert passed == [] and failed["gpu-1"].unresolvable
    cache.apply(DEVICES, "MODIFIED", stamped(device("gpu-1")))
    assert "gpu-1" not in cache.core.device_errors and fits(cache, 8, "gpu-1")


def test_filter_verdicts_agree_with_the_per_node_filter() -> None:
    """The extender's column-built answer says what `filter` says, node for node and in order,
    an invalid Device CR and an unknown node included."""
    cache = cache_with("gpu-1", "gpu-2", "gpu-3")
    broken = stamped(device("gpu-2"))
    broken["spec"]["devices"][0]["minor"] = "zero"
    cache.apply(DEVICES, "MODIFIED", broken)
    cache.apply(PODS, "ADDED", bound("busy", "gpu-3", list(range(8))))
    names = ["gpu-3", "ghost", "gpu-2", "gpu-1"]
    for gpus in (1, 8):
        req = cache.core.request(pod(f"p{gpus}", gpus=gpus))
        passed, rejections = cache.core.filter_each(req, names)
        verdicts = cache.core.filter_nodes(req, names)
        assert verdicts.passed == passed == ["gpu-1"]
        for part in (verdicts.failed, verdicts.unresolvable):
            assert list(part) == [name for name in rejections if name in part]  # the order asked
        both = {**verdicts.failed, **verdicts.unresolvable}
        assert both == {name: rej.message for name, rej in rejections.items()}
        assert {n for n, r in rejections.items() if r.unresolvable} == set(verdicts.unresolvable)
        assert "Device CR is invalid" in verdicts.unresolvable["gpu-2"]
        assert verdicts.failed["ghost"] == "node is not in the allocator's cache yet"


def test_reservation_holds_until_the_pod_shows_up_bound() -> None:
    cache = cache_with("gpu-1")
    p = stamped(pod("w", gpus=8))
    cache.apply(PODS, "ADDED", p)
    res = cache.ledger.reserve(p, cache.core.request(p), "gpu-1")
    assert not isinstance(res, type(None)) and not fits(cache, 1, "gpu-1")
    annotated = stamped(p)
    annotated["metadata"]["annotations"] = {keys.DEVICE_ALLOCATED: res.annotation}
    cache.apply(PODS, "MODIFIED", annotated)  # the PATCH, seen before the binding
    assert cache.ledger.holds and not fits(cache, 1, "gpu-1")
    bound_pod = stamped(annotated)
    bound_pod["spec"]["nodeName"] = "gpu-1"
    cache.apply(PODS, "MODIFIED", bound_pod)  # the binding: the pod's annotation takes over
    assert not cache.ledger.holds and not fits(cache, 1, "gpu-1")
    assert cache.ledger.release(res) is False  # a late rollback of a confirmed bind does nothing
    assert not fits(cache, 1, "gpu-1")


def test_a_hold_ahead_becomes_the_pods_when_it_shows_up_pending_or_already_bound() -> None:
    """Devices chosen at admission (no uid, no name yet) stay used until the pod shows up carrying
    them; then they are the pod's, counted once, whether the watch shows it pending first or (a
    relist) already bound."""
    cache = cache_with("gpu-1")
    for shown_bound in (False, True):
        admitted = pod("", gpus=8)
        admitted["metadata"] = {"generateName": "job-", "namespace": "default"}
        ahead = cache.ledger.reserve_ahead(
            admitted, cache.core.request(admitted), "gpu-1", holder="placement", ttl=60
        )
        assert not isinstance(ahead, type(None)) and ahead.key.startswith("admission:")
        assert not fits(cache, 1, "gpu-1")
        created = stamped(pod(f"job-{int(shown_bound)}", gpus=8, node_name="gpu-1" if shown_bound else None))
        created["metadata"]["annotations"] = {
            keys.DEVICE_ALLOCATED: ahead.annotation,
            keys.ALLOCATED_NODE: "gpu-1",
        }
        cache.apply(PODS, "ADDED", created)
        assert ahead.key not in cache.ledger.holds and not cache.ledger.ahead
        assert not fits(cache, 1, "gpu-1")  # still used: by the pod now
        key = f"default/{created['metadata']['name']}"
        if not shown_bound:
            hold = cache.ledger.holds[key]
            assert (hold.uid, hold.node, hold.annotation) == (
                created["metadata"]["uid"],
                "gpu-1",
                ahead.annotation,
            )
            bound_pod = stamped(created)
            bound_pod["spec"]["nodeName"] = "gpu-1"
            cache.apply(PODS, "MODIFIED", bound_pod)
        assert key not in cache.ledger.holds and cache.pods[key].allocations is not None
        assert not fits(cache, 1, "gpu-1")
        cache.apply(PODS, "DELETED", created)
        assert fits(cache, 8, "gpu-1")  # counted once: its deletion frees all of them


def test_a_pod_that_shows_up_as_admitted_takes_its_hold_without_touching_its_node() -> None:
    """The hold ahead is re-keyed to the pod that carries it (same devices, same request): the node
    is not changed, so the verdicts and scores cached for it stay valid; nor when it is bound as
    held. A pod changed after admission (a later webhook) is counted from its own request: its node
    changes."""
    cache = cache_with("gpu-1")
    state = cache.core.cluster.nodes["gpu-1"]
    for changed in (False, True):
        admitted = pod("", gpus=2)
        admitted["metadata"] = {"generateName": "job-", "namespace": "default"}
        ahead = cache.ledger.reserve_ahead(
            admitted, cache.core.request(admitted), "gpu-1", holder="placement", ttl=60
        )
        assert not isinstance(ahead, type(None)) and ahead.key in state.pods
        version = state.version
        created = stamped(pod(f"job-{int(changed)}", gpus=2, requests={"cpu": "3"} if changed else None))
        created["metadata"]["annotations"] = {
            keys.DEVICE_ALLOCATED: ahead.annotation,
            keys.ALLOCATED_NODE: "gpu-1",
        }
        cache.apply(PODS, "ADDED", created)
        key = f"default/{created['metadata']['name']}"
        assert ahead.key not in state.pods and key in state.pods
        assert (
            cache.core.cluster.pod_node.get(key) == "gpu-1" and ahead.key not in cache.core.cluster.pod_node
        )
        assert (state.version == version) is not changed
        assert state.pods[key].cpu_milli == (3000 if changed else 1000)
        version = state.version
        bound_pod = stamped(created)
        bound_pod["spec"]["nodeName"] = "gpu-1"
        cache.apply(PODS, "MODIFIED", bound_pod)  # bound as held: nothing to count again
        assert key not in cache.ledger.holds and state.version == version and key in state.pods
    assert not fits(cache, 5, "gpu-1") and fits(cache, 4, "gpu-1")


def test_a_pod_seen_before_never_takes_another_pods_hold_ahead() -> None:
    """A running pod holding a share of a GPU is updated (its status) while the same share of that
    GPU is held ahead for a pod being created: the hold ahead stays that pod's."""
    cache = cache_with("gpu-1")
    share = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}

    def hold_ahead() -> Any:
        admitted = pod("", requests=share)
        admitted["metadata"] = {"generateName": "job-", "namespace": "default"}
        got = cache.ledger.reserve_ahead(
            admitted, cache.core.request(admitted), "gpu-1", holder="placement", ttl=60
        )
        assert got.key.startswith("admission:")  # type: ignore[union-attr]
        return got

    first = hold_ahead()
    running = stamped(pod("running", requests=share, node_name="gpu-1"))
    running["metadata"]["annotations"] = {
        keys.DEVICE_ALLOCATED: first.annotation,
        keys.ALLOCATED_NODE: "gpu-1",
    }
    cache.apply(PODS, "ADDED", running)  # shows up bound (a relist): its hold ahead was its own
    assert not cache.ledger.holds and cache.pods["default/running"].allocations is not None
    # The other half of that GPU, the same share, held ahead for the next pod.
    cache.ledger.allocate = lambda req, node: cache.pods["default/running"].allocations  # type: ignore[assignment,return-value]
    second = hold_ahead()
    assert second.annotation == first.annotation
    cache.apply(PODS, "MODIFIED", stamped(running))  # a status update of the running pod
    assert list(cache.ledger.holds) == [second.key] and "default/running" not in cache.ledger.holds
