"""The extender steering of gang members (allocator/gang/steering.py) against an in-memory cache
(tests/gang/fakes.py): a plan's hold decides filter and bind; a member without one is held."""

from __future__ import annotations

from typing import Any

from allocator.gang.holds import GANG_PLAN, PlanHolds
from allocator.gang.index import GangIndex
from allocator.gang.steering import HELD, GangSteering
from allocator.runtime.coreadapter import CoreAdapter, PodRequest
from allocator.runtime.gang_settings import GangSettings
from allocator.runtime.topology import Topology
from apis import keys
from apis.annotations import DeviceAllocations
from tests.gang.fakes import FakeGangCache
from tests.support.allocations import entry
from tests.support.allocator_harness import node, pod

GPUS = DeviceAllocations({"gpu": [entry(0, {"koordinator.sh/gpu-core": 100})]})
NODES = ["gpu-a", "gpu-b"]


def member(name: str, gang: str = "g") -> dict[str, Any]:
    p = pod(name, gpus=1)
    p["metadata"]["uid"] = f"uid-{name}"
    if gang:
        p["metadata"]["labels"] = {keys.POD_GROUP_LABEL: gang}
    return p


def rig() -> tuple[FakeGangCache, PlanHolds, GangSteering, CoreAdapter]:
    cache = FakeGangCache()
    for name in NODES:
        cache.add_node(node(name))
    holds = PlanHolds(cache.ledger)
    core = CoreAdapter()
    settings = GangSettings()
    return cache, holds, GangSteering(core, holds, GangIndex(), settings, Topology(settings, cache)), core


def planned(cache: FakeGangCache, holds: PlanHolds, core: CoreAdapter, name: str, where: str) -> PodRequest:
    p = member(name)
    cache.add_pending(p)
    req = core.request(p)
    assert not isinstance(holds.reserve(req.key, req.uid, where, GPUS, req, "default/g"), str)
    return req


def test_a_planned_member_passes_and_binds_on_its_planned_node_only() -> None:
    cache, holds, steering, core = rig()
    req = planned(cache, holds, core, "m0", "gpu-b")
    passed, failed = steering.filter(req, NODES) or ([], {})
    assert passed == ["gpu-b"] and list(failed) == ["gpu-a"] and failed["gpu-a"].code == GANG_PLAN
    assert steering.bind_refusal(req, "gpu-b") is None
    refusal = steering.bind_refusal(req, "gpu-a")
    assert refusal is not None and refusal.code == GANG_PLAN and "for node gpu-b" in refusal.message


def test_a_member_without_a_plan_is_held_everywhere_and_a_plain_pod_is_left_alone() -> None:
    cache, holds, steering, core = rig()
    req = planned(cache, holds, core, "m0", "gpu-b")
    assert holds.release(req.key) and cache.ledger.holds == {}
    passed, failed = steering.filter(req, NODES) or (["?"], {})
    assert passed == [] and {r.code for r in failed.values()} == {HELD} and list(failed) == NODES
    refusal = steering.bind_refusal(req, "gpu-b")
    assert refusal is not None and "held for gang default/g" in refusal.message
    plain = core.request(member("solo", gang=""))
    assert steering.filter(plain, NODES) is None and steering.bind_refusal(plain, "gpu-a") is None


def test_a_plan_for_an_earlier_pod_of_the_name_refuses_the_new_one() -> None:
    cache, holds, steering, core = rig()
    planned(cache, holds, core, "m0", "gpu-b")
    again = member("m0")
    again["metadata"]["uid"] = "uid-m0-new"
    req = core.request(again)
    passed, failed = steering.filter(req, NODES) or (["?"], {})
    assert passed == [] and all("an earlier pod of this name" in r.message for r in failed.values())
