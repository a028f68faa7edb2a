"""The binder against an in-memory cache (tests/extender/fakes.py) and a stand-in API client: what
it reserves, what the Binding carries, what it rolls back, and the Events it leaves."""

from __future__ import annotations

from typing import Any

from allocator.extender.binder import Binder
from allocator.runtime.coreadapter import CoreAdapter, PodRequest, Rejection
from allocator.runtime.events import PodRef
from allocator.runtime.kube import ApiError
from apis import keys
from apis.annotations import DeviceAllocations
from apis.extender import ExtenderBindingArgs
from tests.extender.fakes import FakeExtenderCache
from tests.support.allocations import entry
from tests.support.allocator_harness import pod

GPUS = DeviceAllocations({"gpu": [entry(3, {"koordinator.sh/gpu-core": 100})]})


class Api:
    """The two calls the binder makes; a binding fails with `refuse` when set."""

    def __init__(self, refuse: ApiError | None = None) -> None:
        self.refuse = refuse
        self.bindings: list[tuple[str, str, str, str, dict[str, str] | None]] = []

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        raise ApiError(404, "NotFound", f"pods {name} not found")

    async def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, *, annotations: dict[str, str] | None = None
    ) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.bindings.append((namespace, name, uid, node, annotations))


class Events:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, str, str]] = []

    def warn(self, pod: dict[str, Any] | PodRef, reason: str, action: str, note: str) -> None:
        ref = pod if isinstance(pod, PodRef) else PodRef.of(pod)
        self.warnings.append((ref.name, reason, note))


def rig(api: Api) -> tuple[Binder, FakeExtenderCache, Events, list[tuple[str, str]]]:
    chosen: list[tuple[str, str]] = []

    def choose(req: PodRequest, node: str) -> DeviceAllocations | Rejection:
        chosen.append((req.key, node))
        return GPUS

    cache = FakeExtenderCache({"gpu-1"}, choose)
    p = pod("w", gpus=1)
    p["metadata"]["uid"] = "uid-w"
    cache.add_pending(p)
    events = Events()
    binder = Binder(api, cache, CoreAdapter(), is_leader=lambda: True, events=events)  # type: ignore[arg-type]
    return binder, cache, events, chosen


async def test_the_binding_carries_the_ledgers_choice_and_the_reservation_stays() -> None:
    api = Api()
    binder, cache, events, chosen = rig(api)
    outcome = await binder.bind(ExtenderBindingArgs("w", "default", "uid-w", "gpu-1"))
    assert outcome.ok and chosen == [("default/w", "gpu-1")]
    assert api.bindings == [("default", "w", "uid-w", "gpu-1", {keys.DEVICE_ALLOCATED: GPUS.to_json()})]
    # Held until the watch shows the pod bound (the cache's job, not the binder's).
    assert list(cache.ledger.holds) == ["default/w"] and events.warnings == []


async def test_a_refused_binding_rolls_the_reservation_back_and_says_why() -> None:
    api = Api(refuse=ApiError(403, "Forbidden", "binding refused"))
    binder, cache, events, _ = rig(api)
    outcome = await binder.bind(ExtenderBindingArgs("w", "default", "uid-w", "gpu-1"))
    assert outcome.reason == "binding_failed" and "binding refused" in outcome.error
    assert cache.ledger.holds == {} and cache.settled == ["default/w", "default/w"]
    assert events.warnings == [("w", "FailedBinding", outcome.error)]


async def test_a_node_the_cache_does_not_know_is_refused_before_any_choice() -> None:
    api = Api()
    binder, cache, events, chosen = rig(api)
    outcome = await binder.bind(ExtenderBindingArgs("w", "default", "uid-w", "gpu-9"))
    assert outcome.reason == "rejected" and "not in the allocator's cache" in outcome.error
    assert chosen == [] and api.bindings == [] and cache.ledger.holds == {}
    assert events.warnings == [("w", "FailedDeviceAllocation", outcome.error)]
