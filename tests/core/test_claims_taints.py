"""Device taints on the allocator's side (allocator/core/claims/): a device tainted NoSchedule or
NoExecute is never handed to a request that does not tolerate it (kube-scheduler's rule), one that
tolerates it may get it and keeps the toleration in its result, and a claim already allocated a
device that turns tainted gets one Event saying so."""

from __future__ import annotations

from typing import Any

from allocator.core.claims.published import NodeDevices
from allocator.core.claims.solve import NO_CANDIDATES
from allocator.core.claims.taints import DEVICE_TAINTED, TaintNotices
from allocator.core.reasons import Rejection
from apis import dra
from apis.dra_claims import Allocation, DeviceResult, ResourceClaim, claim_spec
from apis.dra_taints import NO_EXECUTE, NO_SCHEDULE, NONE, UNHEALTHY_KEY, DeviceTaint, DeviceToleration
from tests.core.test_claims_solve import Node, handed

SICK = DeviceTaint(UNHEALTHY_KEY, NO_SCHEDULE, "XidCriticalError", "2026-11-29T12:00:00Z")


def tainted(node: Node, taints: dict[str, DeviceTaint]) -> None:
    devices = dict(node.pool.devices)
    for name, taint in taints.items():
        devices[name] = devices[name].__class__(**{**vars_of(devices[name]), "taints": (taint,)})
    node.pool = NodeDevices(node.pool.pool, devices)


def vars_of(dev: Any) -> dict[str, Any]:
    return {f: getattr(dev, f) for f in ("name", "driver", "attributes", "capacity", "taints")}


def gpus(count: int, tolerations: list[dict[str, Any]] | None = None) -> Any:
    exactly: dict[str, Any] = {"deviceClassName": dra.GPU_CLASS, "count": count}
    if tolerations:
        exactly["tolerations"] = tolerations
    return claim_spec({"requests": [{"name": "gpus", "exactly": exactly}]}, "")


def test_tainted_gpus_are_never_handed_out() -> None:
    node = Node("dgx-h100")
    tainted(node, {f"gpu-{i}": SICK for i in range(4)} | {"gpu-4": DeviceTaint("x.io/drain", NO_EXECUTE)})
    assert not {f"gpu-{i}" for i in range(5)} & set(handed(node.solve(gpus(2))))
    rej = node.solve(gpus(4))
    assert isinstance(rej, Rejection) and rej.code == NO_CANDIDATES
    assert "3 are; 5 tainted (gpu-0: topoalloc.io/unhealthy=XidCriticalError:NoSchedule)" in str(rej.detail)


def test_a_taint_of_effect_none_only_tells() -> None:
    node = Node("dgx-h100")
    tainted(node, {f"gpu-{i}": DeviceTaint("x.io/note", NONE) for i in range(8)})
    assert len(handed(node.solve(gpus(8)))) == 8


def test_a_request_tolerating_the_taint_may_get_the_device_and_keeps_the_toleration() -> None:
    node = Node("dgx-h100")
    tainted(node, {f"gpu-{i}": SICK for i in range(8)})
    wrong_value = [{"key": UNHEALTHY_KEY, "operator": "Equal", "value": "Other", "effect": NO_SCHEDULE}]
    assert isinstance(node.solve(gpus(1, wrong_value)), Rejection)
    wrong_effect = [{"key": UNHEALTHY_KEY, "operator": "Exists", "effect": NO_EXECUTE}]
    assert isinstance(node.solve(gpus(1, wrong_effect)), Rejection)
    answer = node.solve(gpus(2, [{"key": UNHEALTHY_KEY, "operator": "Exists"}]))
    assert len(handed(answer)) == 2
    (result, _) = answer.results["ns/c0"]  # type: ignore[union-attr]
    assert result.tolerations == (DeviceToleration(UNHEALTHY_KEY, "Exists"),)
    assert result.to_dict()["tolerations"] == [{"key": UNHEALTHY_KEY, "operator": "Exists"}]
    assert len(handed(node.solve(gpus(8, [{"operator": "Exists"}])))) == 8  # every taint


def claim(name: str, device: str, tolerations: tuple[DeviceToleration, ...] = ()) -> ResourceClaim:
    result = DeviceResult("gpus", dra.DRIVER, "n1", device, tolerations=tolerations)
    return ResourceClaim("ns", name, f"uid-{name}", allocation=Allocation((result,), "n1"))


def test_a_claim_on_a_device_turned_tainted_gets_one_event() -> None:
    node = Node("dgx-h100")
    notices = TaintNotices()
    claims = [claim("a", "gpu-3"), claim("b", "gpu-4"), ResourceClaim("ns", "pending", "uid-p")]
    assert notices.step(claims, {"n1": node.pool}) == []
    tainted(node, {"gpu-3": SICK})
    (event,) = notices.step(claims, {"n1": node.pool})
    assert (event.target.kind, event.target.name, event.target.uid) == ("ResourceClaim", "a", "uid-a")
    assert (event.type, event.reason) == ("Warning", DEVICE_TAINTED)
    assert event.note == (
        "device gpu-3 of node n1 is tainted topoalloc.io/unhealthy=XidCriticalError:NoSchedule since "
        "2026-11-29T12:00:00Z: no new claim is allocated it; pods already using it keep it"
    )
    assert notices.step(claims, {"n1": node.pool}) == []  # told once
    healthy = Node("dgx-h100")
    assert notices.step(claims, {"n1": healthy.pool}) == []
    tainted(healthy, {"gpu-3": SICK, "gpu-4": DeviceTaint(UNHEALTHY_KEY, NO_EXECUTE, "GpuLost")})
    events = notices.step(claims, {"n1": healthy.pool})  # came back: told again, and b's too
    assert sorted(e.target.name for e in events) == ["a", "b"]
    assert "evicts the pods using the claim unless they tolerate it" in events[1].note
    tolerant = claim("c", "gpu-4", (DeviceToleration(UNHEALTHY_KEY, "Exists"),))
    (told,) = notices.step([*claims, tolerant], {"n1": healthy.pool})
    assert told.target.name == "c" and told.note.endswith(": the claim tolerates it")
