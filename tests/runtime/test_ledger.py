"""The hold ledger on its own: plain dicts for the cache's pods and nodes, a stand-in for the
core's choice, and a record of what it asked the cache to settle (no watch cache, no core state)."""

from __future__ import annotations

from typing import Any

from allocator.runtime.cache.records import PodEntry, requests_digest
from allocator.runtime.coreadapter import CoreAdapter, PodRequest, Rejection
from allocator.runtime.ledger import HoldLedger, Placed
from allocator.runtime.metrics import Metrics
from apis.annotations import DeviceAllocations
from tests.support.allocations import entry
from tests.support.allocator_harness import pod

GPUS = DeviceAllocations({"gpu": [entry(0, {"koordinator.sh/gpu-core": 100})]})


class Rig:
    def __init__(self) -> None:
        self.pods: dict[str, PodEntry] = {}
        self.nodes = {"gpu-1"}
        self.settled: list[str] = []
        self.chosen: list[tuple[str, str]] = []
        self.now = 100.0
        self.metrics = Metrics()
        self.ledger = HoldLedger(
            self.allocate,
            pods=self.pods,
            nodes=self.nodes,
            settle=self.settled.append,
            ttl=30.0,
            metrics=self.metrics,
            clock=lambda: self.now,
        )

    def metric(self, name: str) -> float | None:
        return self.metrics.registry.get_sample_value(name)

    def allocate(self, req: PodRequest, node: str) -> DeviceAllocations | Rejection:
        self.chosen.append((req.key, node))
        return GPUS

    def pending(self, name: str) -> tuple[dict[str, Any], PodRequest]:
        p = pod(name, gpus=1)
        p["metadata"]["uid"] = f"uid-{name}"
        key = f"default/{name}"
        self.pods[key] = PodEntry(key, f"uid-{name}", "", True, None, None, b"", p)
        return p, CoreAdapter().request(p)


def test_a_bind_reservation_holds_until_its_ttl_then_rolls_back() -> None:
    rig = Rig()
    p, req = rig.pending("w")
    res = rig.ledger.reserve(p, req, "gpu-1")
    assert not isinstance(res, Rejection)
    assert rig.chosen == [("default/w", "gpu-1")] and rig.settled == ["default/w"]
    assert res.annotation == GPUS.to_json() and res.expires == 130.0 and not res.holder
    assert rig.metric("topoalloc_reservations") == 1
    rig.now = 129.0
    assert rig.ledger.expire() == 0 and "default/w" in rig.ledger.holds
    rig.now = 130.0
    assert rig.ledger.expire() == 1
    assert rig.ledger.holds == {} and rig.settled == ["default/w", "default/w"]
    assert rig.metric("topoalloc_reservations") == 0
    assert rig.metric("topoalloc_reservations_expired_total") == 1


def test_the_guard_refuses_before_the_core_chooses() -> None:
    rig = Rig()
    p, req = rig.pending("w")
    refusal = Rejection("topoalloc: held for gang", "held")
    rig.ledger.guard = lambda _req, _node: refusal
    assert rig.ledger.reserve(p, req, "gpu-1") is refusal
    assert rig.chosen == [] and rig.ledger.holds == {} and rig.settled == []


def test_a_hold_is_taken_by_bind_and_survives_its_rollback() -> None:
    rig = Rig()
    p, req = rig.pending("m")
    held = rig.ledger.hold("default/m", "uid-m", "gpu-1", GPUS, req, "ns/gang")
    assert not isinstance(held, str) and held.holder == "ns/gang"
    assert (
        rig.ledger.hold("default/m", "uid-m", "gpu-1", GPUS, req, "ns/gang") == "the pod or its node is busy"
    )
    got = rig.ledger.reserve(p, req, "gpu-1")
    assert got is held and held.binding and rig.chosen == []  # bind takes the held devices
    assert rig.ledger.drop_hold("default/m") is False  # its bind is under way
    assert rig.ledger.release(held) is True and not held.binding  # the plan stands
    assert "default/m" in rig.ledger.holds
    rig.now = 10**9
    assert rig.ledger.expire() == 0  # a hold has no TTL
    assert rig.ledger.drop_hold("default/m") is True and rig.ledger.holds == {}


def test_a_hold_is_refused_for_a_pod_that_is_gone_or_bound() -> None:
    rig = Rig()
    _, req = rig.pending("m")
    assert rig.ledger.hold("default/m", "another-uid", "gpu-1", GPUS, req, "g") == (
        "the pod is gone, bound or finished"
    )
    rig.pods["default/m"].node = "gpu-1"
    assert (
        rig.ledger.hold("default/m", "uid-m", "gpu-1", GPUS, req, "g") == "the pod is gone, bound or finished"
    )
    assert rig.ledger.holds == {} and rig.settled == []


def test_a_placer_chooses_an_owners_devices_and_the_binding_carries_its_room() -> None:
    rig = Rig()
    rig.ledger.placer = lambda pod, req, node, key: Placed(GPUS, "train", {"extra": "yes"})
    dropped: list[str] = []
    rig.ledger.on_drop.append(lambda res: dropped.append(f"{res.key}:{res.room}"))
    p, req = rig.pending("owner")
    res = rig.ledger.reserve(p, req, "gpu-1")
    assert not isinstance(res, Rejection)
    assert rig.chosen == [] and (res.room, dict(res.extra)) == ("train", {"extra": "yes"})
    assert rig.ledger.release(res) and dropped == ["default/owner:train"]
    refusal = Rejection("Reservation(s) none", "Reservation(s) none")
    rig.ledger.placer = lambda pod, req, node, key: refusal
    assert rig.ledger.reserve(p, req, "gpu-1") is refusal


def test_a_room_is_held_without_a_pod_and_replaced_only_when_it_changes() -> None:
    rig = Rig()
    held = PodRequest(key="reservation:r", cpu_milli=1000, memory=0)
    rig.ledger.hold_room("reservation:r", "gpu-1", GPUS, held)
    first = rig.ledger.holds["reservation:r"]
    assert first.holder == "reservation" and first.expires == float("inf")
    rig.ledger.hold_room("reservation:r", "gpu-1", GPUS, held)  # unchanged: the same entry
    assert rig.ledger.holds["reservation:r"] is first and rig.settled == ["reservation:r"]
    rig.ledger.hold_room("reservation:r", "gpu-1", DeviceAllocations({}), held)
    assert rig.ledger.holds["reservation:r"].token != first.token
    assert rig.ledger.expire() == 0  # a room has no TTL
    assert rig.ledger.drop_room("reservation:r") and "reservation:r" not in rig.ledger.holds
    assert not rig.ledger.drop_room("default/nobody")


def admitted(cpu: str = "1") -> dict[str, Any]:
    """A pod as its creation is admitted: no uid, no name yet (its controller's generateName)."""
    p = pod("", gpus=1, requests={"cpu": cpu})
    p["metadata"] = {"generateName": "job-", "namespace": "default"}
    return p


def test_a_hold_ahead_becomes_its_pods_when_the_pod_shows_up() -> None:
    rig = Rig()
    moved: list[tuple[str, str]] = []
    dropped: list[str] = []
    rig.ledger.on_move.append(lambda old, res: moved.append((old, res.key)))
    rig.ledger.on_drop.append(lambda res: dropped.append(res.key))
    keys_seen: list[str] = []
    rig.ledger.placer = lambda pod, req, node, key: keys_seen.append(key)
    p = admitted()
    ahead = rig.ledger.reserve_ahead(p, CoreAdapter().request(p), "gpu-1", holder="placement", ttl=60.0)
    assert not isinstance(ahead, Rejection)
    assert ahead.key.startswith("admission:") and ahead.key == keys_seen[0]  # the placer keys by it
    assert (ahead.uid, ahead.holder, ahead.expires) == ("", "placement", 160.0)
    assert rig.ledger.ahead == {("gpu-1", GPUS.to_json()): [ahead.key]} and rig.settled == [ahead.key]
    gone = rig.ledger.reserve_ahead(p, CoreAdapter().request(p), "gone", holder="placement", ttl=60.0)
    assert isinstance(gone, Rejection)
    # The pod shows up with another node's allocation, or none that was held ahead: not its hold.
    _, req = rig.pending("job-x")
    parsed: list[str] = []

    def parse() -> PodRequest:
        parsed.append("again")
        return req

    changed = b"a sidecar added by a later webhook"
    assert rig.ledger.adopt("default/job-x", "uid-job-x", "gpu-2", GPUS.to_json(), changed, parse) is None
    assert rig.ledger.adopt("default/job-x", "uid-job-x", "gpu-1", "{}", changed, parse) is None
    got = rig.ledger.adopt("default/job-x", "uid-job-x", "gpu-1", GPUS.to_json(), changed, parse)
    assert got is not None and rig.ledger.holds == {"default/job-x": got} and parsed == ["again"]
    assert (got.key, got.uid, got.token, got.request, got.expires) == (
        "default/job-x",
        "uid-job-x",
        ahead.token,
        req,
        float("inf"),
    )
    assert rig.ledger.ahead == {} and moved == [(ahead.key, "default/job-x")] and dropped == []
    assert rig.settled == [ahead.key, ahead.key, "default/job-x"]
    rig.now = 10**9
    assert rig.ledger.expire() == 0  # the pod's now: its placement drops it (bound, gone)
    assert rig.ledger.adopt("default/job-x", "uid-job-x", "gpu-1", GPUS.to_json(), changed, parse) is None
    # A pod that shows up asking what it asked at admission keeps the request parsed then.
    again = rig.ledger.reserve_ahead(p, CoreAdapter().request(p), "gpu-1", holder="placement", ttl=60.0)
    assert not isinstance(again, Rejection)
    kept = rig.ledger.adopt(
        "default/job-y", "uid-y", "gpu-1", GPUS.to_json(), requests_digest(p["spec"]), parse
    )
    assert kept is not None and parsed == ["again"]
    assert (kept.request.key, kept.request.uid, kept.request.cpu_milli) == ("default/job-y", "uid-y", 1000)
    assert kept.request.signature == again.request.signature


def test_a_hold_ahead_nobody_takes_up_goes_at_its_ttl() -> None:
    rig = Rig()
    dropped: list[str] = []
    rig.ledger.on_drop.append(lambda res: dropped.append(res.key))
    p = admitted()
    ahead = rig.ledger.reserve_ahead(p, CoreAdapter().request(p), "gpu-1", holder="placement", ttl=60.0)
    assert not isinstance(ahead, Rejection)
    rig.now = 159.0
    assert rig.ledger.expire() == 0 and ahead.key in rig.ledger.holds
    rig.now = 160.0
    assert rig.ledger.expire() == 1  # its creation was refused after admission
    assert rig.ledger.holds == {} and rig.ledger.ahead == {} and dropped == [ahead.key]
    assert rig.settled == [ahead.key, ahead.key]


def test_holds_ahead_of_shares_of_one_gpu_are_told_apart_by_their_requests() -> None:
    """Two pods may hold the same share of one GPU (the same allocation JSON on the same node):
    each arriving pod takes the hold made for its size, so its cpu and memory count as asked."""
    rig = Rig()
    small, big = admitted("1"), admitted("8")
    for p in (small, big):
        assert not isinstance(
            rig.ledger.reserve_ahead(p, CoreAdapter().request(p), "gpu-1", holder="p", ttl=60.0), Rejection
        )
    assert len(rig.ledger.ahead[("gpu-1", GPUS.to_json())]) == 2
    shown = pod("job-big", gpus=1, requests={"cpu": "8"})
    shown["metadata"]["uid"] = "uid-big"
    req = CoreAdapter().request(shown)
    got = rig.ledger.adopt("default/job-big", "uid-big", "gpu-1", GPUS.to_json(), b"", lambda: req)
    assert got is not None and got.request.cpu_milli == 8000
    (left,) = rig.ledger.ahead[("gpu-1", GPUS.to_json())]
    assert rig.ledger.holds[left].request.cpu_milli == 1000
