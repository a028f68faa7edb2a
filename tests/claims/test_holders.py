"""Which claims hold each device (allocator/claims/holders.py): contested devices, the devices one of
two claims let go of (kube-scheduler then counts them free), and the claims announcing them."""

from __future__ import annotations

from typing import Any

from allocator.claims.holders import ClaimHolders
from apis import dra


def obj(name: str, rv: int, *devices: str, announces: str = "", uid: str = "") -> dict[str, Any]:
    results = [{"request": "g", "driver": dra.DRIVER, "pool": "n1", "device": d} for d in devices]
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": uid or f"u-{name}",
        "resourceVersion": str(rv),
    }
    if announces:
        meta["annotations"] = {dra.ANNOUNCES_ANNOTATION: announces}
    status = {"allocation": {"devices": {"results": results}}} if devices else {}
    return {"metadata": meta, "status": status}


def test_a_device_in_two_claims_is_contested_until_one_lets_go_and_is_then_dropped() -> None:
    h = ClaimHolders()
    assert not h.update("ns/a", obj("a", 10, "gpu-0"))
    assert h.since("ns/a") == 10 and h.rivals("ns/a") == ()
    assert h.update("ns/b", obj("b", 12, "gpu-0", "gpu-1"))  # gpu-0 now in two claims
    assert h.contested == {("n1", "gpu-0")} and h.rivals("ns/a") == ("ns/b",)
    assert not h.update("ns/b", obj("b", 15, "gpu-0", "gpu-1"))  # reserved: the same devices
    assert h.since("ns/b") == 12  # since its allocation was first seen
    h.update("ns/a", None)  # deleted: b still holds gpu-0, kube-scheduler counts it free
    assert h.contested == set() and h.dropped == {("n1", "gpu-0")}
    h.update("ns/b", obj("b", 20))  # deallocated: nothing holds gpu-0 any more
    assert h.dropped == set() and not h.held(("n1", "gpu-0"))


def test_an_announcing_claim_is_no_holder_and_its_deletion_under_a_holder_drops_the_device() -> None:
    h = ClaimHolders()
    h.update("ns/b", obj("b", 12, "gpu-0"))
    assert not h.update("sys/p", obj("p", 30, "gpu-0", announces="n1/gpu-0"))
    assert h.contested == set() and h.announcing == {("n1", "gpu-0"): ("sys/p", True)}
    h.update("sys/p", None)
    assert h.announcing == {} and h.dropped == {("n1", "gpu-0")}


def shared(name: str, rv: int, cores: int | None, memory: str = "10Gi") -> dict[str, Any]:
    """A claim holding a share of gpu-0 (cores None: a whole allocation, no shareID)."""
    out = obj(name, rv, "gpu-0")
    if cores is not None:
        (result,) = out["status"]["allocation"]["devices"]["results"]
        result["shareID"] = f"share-{name}"
        result["consumedCapacity"] = {"cores": str(cores), "memory": memory}
    return out


GPU_CAPACITY = {"cores": 100, "memory": 80 * 1024**3}


def test_shares_hold_what_they_consume_and_conflict_only_beyond_the_device() -> None:
    h = ClaimHolders(lambda device: GPU_CAPACITY if device == ("n1", "gpu-0") else None)
    assert not h.update("ns/a", shared("a", 10, 50))
    assert not h.update("ns/b", shared("b", 11, 50))  # 100 cores together: they fit
    assert h.contested == set() and h.rivals("ns/b") == ()
    assert h.update("ns/c", shared("c", 12, 10))  # 110: c does not fit
    assert h.contested == {("n1", "gpu-0")}
    assert h.rivals("ns/a") == () and h.rivals("ns/b") == ()  # they were there first and fit
    assert h.rivals("ns/c") == ("ns/a", "ns/b")
    h.update("ns/a", None)  # a let go: b and c fit, and a share's drop is no whole drop
    assert h.contested == set() and h.dropped == set()


def test_a_whole_allocation_and_a_share_of_one_device_conflict() -> None:
    h = ClaimHolders(lambda device: GPU_CAPACITY)
    h.update("ns/a", shared("a", 10, 10))
    assert h.update("ns/w", shared("w", 11, None))  # kube-scheduler's whole allocation, no shareID
    assert h.contested == {("n1", "gpu-0")} and h.rivals("ns/w") == ("ns/a",)
    assert h.rivals("ns/a") == ()  # the share came first and fits


def test_memory_counts_as_cores_do() -> None:
    h = ClaimHolders(lambda device: GPU_CAPACITY)
    h.update("ns/a", shared("a", 10, 10, "60Gi"))
    assert h.update("ns/b", shared("b", 11, 10, "30Gi"))  # 90Gi of 80Gi
    assert h.rivals("ns/b") == ("ns/a",)
