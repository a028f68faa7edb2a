"""Shares of one GPU prepared through the agent's DRA plugin (real gRPC, the stand-in kubelet, the
fake API server): a result with a shareID is prepared for its claim alone, with HAMi-core's limits
in the claim's CDI spec and the share_id on the gRPC Device; shares that together would exceed the
GPU, or a whole allocation beside a share, are refused; the shares survive an agent restart."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from agent.dra import prepared as prepared_module
from agent.dra.cdi import ENV_GPUS
from apis import dra
from tests.agent.dra.rig import NS, DraRig, result
from tests.agent.dra.test_kubelet_plugin import cdi_id, cdi_spec, prepare_direct
from tests.support.dra_kubelet import PrepareError

GIB = 1 << 30
GPU0_MEMORY = 81559 << 20  # the DGX H100 fixture's GPU memory


def share(device: str, memory: int, cores: int, request: str = "r") -> dict[str, Any]:
    """A result as kube-scheduler (or topoalloc) writes it for a sharable device."""
    return {
        **result(device, request),
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {dra.CAPACITY_MEMORY: str(memory), dra.CAPACITY_CORES: str(cores)},
    }


def share_pod(
    rig: DraRig, pod_name: str, claim_name: str, results: list[dict[str, Any]]
) -> tuple[dict, dict]:
    pod = rig.pod(pod_name, {"c": claim_name})
    return pod, rig.put_claim(claim_name, results, pod_uid=pod["metadata"]["uid"])


def env(rig: DraRig, claim: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in cdi_spec(rig, claim)["containerEdits"]["env"])


def gpu_uuid(rig: DraRig, minor: int) -> str:
    assert rig.plugin.preparer.device is not None
    return next(d.id for d in rig.plugin.preparer.device.devices if d.type == "gpu" and d.minor == minor)


def test_two_shares_of_one_gpu_are_prepared_each_with_its_limits_and_share_id(rig: DraRig) -> None:
    assert rig.kubelet is not None
    first = share("gpu-0", 20 * GIB, 30)
    second = share("gpu-0", 40 * GIB, 50)
    pod1, claim1 = share_pod(rig, "p1", "c1", [first])
    pod2, claim2 = share_pod(rig, "p2", "c2", [second])
    assert rig.kubelet.prepare(pod1) == {"main": [cdi_id(claim1, "gpu-0")]}
    assert rig.kubelet.prepare(pod2) == {"main": [cdi_id(claim2, "gpu-0")]}
    # each claim's spec carries its own share's limits (MiB with HAMi's suffix, percent)
    assert env(rig, claim1) == {
        ENV_GPUS: gpu_uuid(rig, 0),
        "CUDA_DEVICE_MEMORY_LIMIT_0": "20480m",
        "CUDA_DEVICE_SM_LIMIT": "30",
    }
    assert env(rig, claim2)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "40960m"
    assert env(rig, claim2)["CUDA_DEVICE_SM_LIMIT"] == "50"
    # kubelet is told which share each Device is (the v1 API's share_id)
    answer = prepare_direct(rig, ("c1", claim1["metadata"]["uid"]), ("c2", claim2["metadata"]["uid"]))
    assert [d.share_id for d in answer.claims[claim1["metadata"]["uid"]].devices] == [first["shareID"]]
    assert [d.share_id for d in answer.claims[claim2["metadata"]["uid"]].devices] == [second["shareID"]]


def test_a_share_that_would_exceed_the_gpu_is_refused(rig: DraRig) -> None:
    assert rig.kubelet is not None
    for i, (memory, cores) in enumerate(((20 * GIB, 30), (40 * GIB, 50))):
        rig.kubelet.prepare(share_pod(rig, f"p{i}", f"c{i}", [share("gpu-0", memory, cores)])[0])
    too_much_compute, claim = share_pod(rig, "p3", "c3", [share("gpu-0", 10 * GIB, 30)])
    with pytest.raises(
        PrepareError, match=r"c3: .*device gpu-0 cannot take this share: cores 30 asked, 80 of 100 already"
    ):
        rig.kubelet.prepare(too_much_compute)
    assert not (rig.cdi / f"topoalloc.io-claim_{claim['metadata']['uid']}.json").exists()
    too_much_memory, _ = share_pod(rig, "p4", "c4", [share("gpu-0", 30 * GIB, 10)])
    with pytest.raises(PrepareError, match=r"c4: .*cannot take this share: memory"):
        rig.kubelet.prepare(too_much_memory)
    fits, claim5 = share_pod(rig, "p5", "c5", [share("gpu-0", 10 * GIB, 20)])  # exactly the rest of cores
    assert rig.kubelet.prepare(fits) == {"main": [cdi_id(claim5, "gpu-0")]}


def test_a_whole_allocation_and_a_share_never_hold_one_gpu(rig: DraRig) -> None:
    assert rig.kubelet is not None
    shared, _ = share_pod(rig, "p1", "c1", [share("gpu-1", 8 * GIB, 25)])
    rig.kubelet.prepare(shared)
    whole, _ = share_pod(rig, "p2", "c2", [result("gpu-1")])  # no shareID: the whole GPU
    with pytest.raises(
        PrepareError, match=r"c2: .*gpu-1 is already prepared for claim default/c1 .*as a share"
    ):
        rig.kubelet.prepare(whole)
    first_whole, _ = share_pod(rig, "p3", "c3", [result("gpu-2")])
    rig.kubelet.prepare(first_whole)
    late_share, _ = share_pod(rig, "p4", "c4", [share("gpu-2", 8 * GIB, 25)])
    with pytest.raises(
        PrepareError, match=r"c4: .*gpu-2 is already prepared for claim default/c3 .*as a whole"
    ):
        rig.kubelet.prepare(late_share)


def test_a_share_of_the_whole_gpu_gets_no_limits_and_leaves_no_room(rig: DraRig) -> None:
    """What kube-scheduler writes for a claim asking no capacity of a sharable GPU: a shareID and the
    defaults, the whole GPU."""
    assert rig.kubelet is not None
    pod, claim = share_pod(rig, "p1", "c1", [share("gpu-3", GPU0_MEMORY, 100)])
    rig.kubelet.prepare(pod)
    assert cdi_spec(rig, claim)["containerEdits"]["env"] == [f"{ENV_GPUS}={gpu_uuid(rig, 3)}"]
    other, _ = share_pod(rig, "p2", "c2", [share("gpu-3", 1 << 20, 1)])
    with pytest.raises(PrepareError, match=r"c2: .*gpu-3 cannot take this share: memory 1048576 asked"):
        rig.kubelet.prepare(other)


def test_shares_survive_an_agent_restart(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    first = share("gpu-4", 30 * GIB, 60)
    pod, claim = share_pod(rig, "p1", "c1", [first])
    kubelet.prepare(pod)
    spec = cdi_spec(rig, claim)
    rig.stop_agent()
    store = prepared_module.PreparedClaims(rig.state)
    store.load()
    (kept,) = store.claims[claim["metadata"]["uid"]].devices
    assert (kept.share_id, kept.consumed) == (first["shareID"], {"memory": 30 * GIB, "cores": 60})
    rig.server.remove("resourceclaims", "c1", NS)  # the answer must come from the checkpoint
    rig.start_agent()
    kubelet.cache.clear()
    answer = prepare_direct(rig, ("c1", claim["metadata"]["uid"]))
    assert [d.share_id for d in answer.claims[claim["metadata"]["uid"]].devices] == [first["shareID"]]
    assert json.loads((rig.cdi / f"topoalloc.io-claim_{claim['metadata']['uid']}.json").read_text()) == spec
    # the restarted agent still counts the share: 60 cores held, 50 more do not fit, 40 do
    over, _ = share_pod(rig, "p2", "c2", [share("gpu-4", 10 * GIB, 50)])
    with pytest.raises(PrepareError, match=r"cores 50 asked, 60 of 100 already prepared for default/c1"):
        kubelet.prepare(over)
    fits, claim3 = share_pod(rig, "p3", "c3", [share("gpu-4", 10 * GIB, 40)])
    assert kubelet.prepare(fits) == {"main": [cdi_id(claim3, "gpu-4")]}


def test_one_claim_whose_shares_of_a_gpu_exceed_it_is_refused(rig: DraRig) -> None:
    """Two requests of one claim on one GPU count together."""
    assert rig.kubelet is not None
    pod, _ = share_pod(rig, "p1", "c1", [share("gpu-6", GIB, 60, "a"), share("gpu-6", GIB, 60, "b")])
    with pytest.raises(PrepareError, match=r"c1: .*gpu-6 cannot take this share: cores 120 asked, 0 of 100"):
        rig.kubelet.prepare(pod)
    fits, claim2 = share_pod(rig, "p2", "c2", [share("gpu-7", GIB, 40, "a"), share("gpu-7", GIB, 30, "b")])
    assert rig.kubelet.prepare(fits) == {"main": [cdi_id(claim2, "gpu-7")]}
    assert env(rig, claim2)["CUDA_DEVICE_SM_LIMIT"] == "70"
