"""A pod that reaches the node without an allocation for it, end to end: the stand-in kubelet admits
it through the agent's device plugins (real gRPC), the agent chooses its devices by topology, writes
them into the pod's annotation with `allocated-node` naming the node, and says so in a Normal Event;
what cannot be served is refused with a Warning Event; a restart between Allocate and the write
still writes it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from apis import keys
from apis.annotations import parse_device_allocated
from tests.agent.deviceplugin.rig import NODE, Rig, allocated, gpu_entry, pod_doc
from tests.agent.deviceplugin.test_kubelet_flow import H100
from tests.agent.support import wait_for
from tests.support.agent_node import AgentNode
from tests.support.fakeapi import FakeApiServer
from tests.support.kubelet import AdmissionError

CHOSEN = "DevicesChosenOnNode"
REFUSED = "DeviceAllocationRefused"
JOINT_VF = {
    keys.DEVICE_JOINT_ALLOCATE: json.dumps({"deviceTypes": ["gpu", "rdma"]}),
    keys.DEVICE_ALLOCATE_HINT: json.dumps({"rdma": {"vfSelector": {"matchLabels": {"type": "general"}}}}),
}


def put(
    rig: Rig, name: str, containers: dict[str, dict[str, str]], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    doc = pod_doc(name, containers, None)
    doc["metadata"]["annotations"] = dict(annotations or {})
    return rig.server.put(doc)


def written(rig: Rig, name: str, entries: int = 1) -> dict[str, str]:
    """The pod's annotations once the agent wrote its choice (at least `entries` devices)."""

    def done() -> dict[str, str] | None:
        ann = rig.server.get("pods", name, "default")["metadata"].get("annotations") or {}
        if ann.get(keys.ALLOCATED_NODE) != NODE or keys.DEVICE_ALLOCATED not in ann:
            return None
        got = parse_device_allocated(ann[keys.DEVICE_ALLOCATED])
        return ann if len(got["gpu"]) + len(got["rdma"]) >= entries else None

    assert wait_for(done, timeout=10), f"{name}: no annotation written"
    return done() or {}


def chosen_events(rig: Rig, name: str) -> list[dict[str, Any]]:
    return [e for e in rig.events(CHOSEN) if e["involvedObject"]["name"] == name]


@pytest.fixture
def dgx1(make_rig) -> Iterator[Rig]:
    rig = make_rig("dgx1-v100")
    rig.start_kubelet()
    rig.start_agent(wait_for=("nvidia.com/gpu", "koordinator.sh/gpu-core"))
    yield rig


def test_a_pod_without_annotation_gets_the_best_set_written_with_an_event(dgx1: Rig) -> None:
    assert dgx1.kubelet is not None
    pod = put(dgx1, "pair", {"main": {"nvidia.com/gpu": "2"}})
    got = dgx1.kubelet.admit(pod)["main"]["nvidia.com/gpu"]
    assert ("GetPreferredAllocation", "nvidia.com/gpu") in dgx1.kubelet.calls
    assert sorted(got.ids) == sorted([dgx1.uuid(0), dgx1.uuid(3)])  # the pair with two NVLinks
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": f"{dgx1.uuid(0)},{dgx1.uuid(3)}"}
    ann = written(dgx1, "pair", 2)
    entries = parse_device_allocated(ann[keys.DEVICE_ALLOCATED])["gpu"]
    assert [(e.minor, e.id) for e in entries] == [(0, dgx1.uuid(0)), (3, dgx1.uuid(3))]
    assert {k: str(v) for k, v in (entries[0].resources or {}).items()} == {
        "koordinator.sh/gpu-core": "100",
        "koordinator.sh/gpu-memory": "33290752Ki",
        "koordinator.sh/gpu-memory-ratio": "100",
    }
    assert wait_for(lambda: chosen_events(dgx1, "pair"))
    (event,) = chosen_events(dgx1, "pair")
    assert event["type"] == "Normal"
    assert "has no scheduling.koordinator.sh/device-allocated annotation" in event["message"]
    assert f"GPU 0 ({dgx1.uuid(0)}), GPU 3 ({dgx1.uuid(3)})" in event["message"]
    # a second pair goes next to it, never onto its GPUs; the cross-check has nothing to say
    second = dgx1.kubelet.admit(put(dgx1, "next", {"main": {"nvidia.com/gpu": "2"}}))["main"][
        "nvidia.com/gpu"
    ]
    assert sorted(second.ids) == sorted([dgx1.uuid(1), dgx1.uuid(2)])
    assert dgx1.plugins.checker.check() == []


def test_a_pod_placed_for_another_node_gets_devices_here(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    elsewhere = {
        keys.DEVICE_ALLOCATED: allocated([gpu_entry(5, "GPU-of-another-node")]),
        keys.ALLOCATED_NODE: "gpu-other",
    }
    got = kubelet.admit(put(rig, "moved", {"main": {"nvidia.com/gpu": "1"}}, elsewhere))["main"][
        "nvidia.com/gpu"
    ]
    assert got.ids == [H100[0]]
    ann = written(rig, "moved")
    assert [(e.minor, e.id) for e in parse_device_allocated(ann[keys.DEVICE_ALLOCATED])["gpu"]] == [
        (0, H100[0])
    ]
    assert wait_for(lambda: chosen_events(rig, "moved"))
    assert "was made for node gpu-other" in chosen_events(rig, "moved")[0]["message"]
    # annotated for this node by its name: the allocator's choice, served as before
    here = {keys.DEVICE_ALLOCATED: allocated([gpu_entry(5, H100[5])]), keys.ALLOCATED_NODE: NODE}
    assert kubelet.admit(put(rig, "placed", {"main": {"nvidia.com/gpu": "1"}}, here))["main"][
        "nvidia.com/gpu"
    ].ids == [H100[5]]
    assert chosen_events(rig, "placed") == []


def test_pods_never_share_devices_and_what_cannot_be_served_is_refused(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    a = kubelet.admit(put(rig, "a", {"main": {"nvidia.com/gpu": "4"}}))["main"]["nvidia.com/gpu"]
    b = kubelet.admit(put(rig, "b", {"main": {"nvidia.com/gpu": "4"}}))["main"]["nvidia.com/gpu"]
    assert sorted(a.ids) == sorted(H100[m] for m in range(4))  # one NUMA node each
    assert sorted(b.ids) == sorted(H100[m] for m in range(4, 8))
    # kubelet counts gpu-core apart and offers it; the node has no GPU left to share
    share = put(
        rig, "share", {"main": {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}}
    )
    with pytest.raises(AdmissionError, match="this node cannot serve it: container 'main' asks 1 × "):
        kubelet.admit(share)
    assert "default/share" not in kubelet.allocations
    (event,) = [e for e in rig.events(REFUSED) if e["involvedObject"]["name"] == "share"]
    assert event["type"] == "Warning"
    assert (
        "has no scheduling.koordinator.sh/device-allocated annotation and this node cannot serve it"
        in event["message"]
    )
    assert "free here: no GPU" in event["message"]
    written(rig, "a", 4)
    written(rig, "b", 4)


def test_two_containers_are_merged_into_one_annotation(dgx1: Rig) -> None:
    assert dgx1.kubelet is not None
    pod = put(dgx1, "split", {"trainer": {"nvidia.com/gpu": "2"}, "helper": {"nvidia.com/gpu": "1"}})
    got = dgx1.kubelet.admit(pod)
    assert sorted(got["trainer"]["nvidia.com/gpu"].ids) == sorted([dgx1.uuid(0), dgx1.uuid(3)])
    helper = got["helper"]["nvidia.com/gpu"].ids
    assert helper not in ([dgx1.uuid(0)], [dgx1.uuid(3)])
    ann = written(dgx1, "split", 3)
    minors = [e.minor for e in parse_device_allocated(ann[keys.DEVICE_ALLOCATED])["gpu"]]
    assert minors[:2] == [0, 3] and [dgx1.uuid(minors[2])] == helper  # in container order


@pytest.mark.parametrize("rdma_first", [False, True])
def test_gpu_and_vf_behind_one_switch_whichever_kubelet_asks_first(make_rig, rdma_first: bool) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    limits = {"nvidia.com/gpu": "1", "koordinator.sh/rdma": "1"}
    if rdma_first:  # kubelet walks a container's resources in map order
        limits = dict(reversed(limits.items()))
    pod = put(rig, "joint", {"main": limits}, JOINT_VF)
    pod["spec"]["containers"][0]["resources"]["limits"] = limits  # kubelet's order, whatever the API's
    got = kubelet.admit(pod)["main"]
    assert [r for c, r in kubelet.calls if c == "Allocate"] == list(limits)
    assert got["nvidia.com/gpu"].ids == [H100[0]]
    assert got["koordinator.sh/rdma"].ids == ["0000:18:00.0-u00"]  # NIC 0: behind GPU 0's switch
    assert got["koordinator.sh/rdma"].envs == {"PCIDEVICE_KOORDINATOR_SH_RDMA": "0000:18:00.1"}
    ann = parse_device_allocated(written(rig, "joint", 2)[keys.DEVICE_ALLOCATED])
    (nic,) = ann["rdma"]
    assert (nic.minor, nic.id, [vf.bus_id for vf in nic.vfs]) == (0, "0000:18:00.0", ["0000:18:00.1"])


def test_ids_kubelet_chose_itself_are_served_when_free_and_refused_when_not(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    kubelet.ask_preferred = False  # kubelet's Topology Manager left it nothing to ask
    lowest = min(H100.values())  # kubelet takes the available IDs in order
    got = kubelet.admit(put(rig, "own", {"main": {"nvidia.com/gpu": "1"}}))["main"]["nvidia.com/gpu"]
    assert got.ids == [lowest]
    minor = next(m for m, u in H100.items() if u == lowest)
    ann = written(rig, "own")
    assert [e.minor for e in parse_device_allocated(ann[keys.DEVICE_ALLOCATED])["gpu"]] == [minor]
    # a share of the next GPU kubelet will offer, served to another pod: kubelet counts the two
    # resources apart, the agent does not
    second = min(u for u in H100.values() if u != lowest)
    m2 = next(m for m, u in H100.items() if u == second)
    kubelet.ask_preferred = True
    placed = put(rig, "shared", {"main": {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}},
                 {keys.DEVICE_ALLOCATED: allocated([gpu_entry(m2, second, core=50)])})  # fmt: skip
    kubelet.admit(placed)
    kubelet.ask_preferred = False
    with pytest.raises(AdmissionError, match=f"kubelet offered {second}"):
        kubelet.admit(put(rig, "clash", {"main": {"nvidia.com/gpu": "1"}}))


def test_a_restart_before_the_write_still_writes_it(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    fault = rig.server.inject_fault("PATCH", r"/pods/late$", status=503, times=None)
    kubelet.admit(put(rig, "late", {"main": {"nvidia.com/gpu": "1"}}))
    assert wait_for(lambda: fault.hits >= 2 and rig.plugins.node_writes.pending() == 1)  # retried
    assert keys.ALLOCATED_NODE not in (
        rig.server.get("pods", "late", "default")["metadata"].get("annotations") or {}
    )
    # the cross-check judges the pod by the node's choice, not by the annotation not written yet
    assert rig.plugins.checker.check() == [] and rig.events("DeviceAllocationMismatch") == []
    rig.stop_agent()
    rig.server.clear_faults()
    rig.start_agent()
    ann = written(rig, "late")
    assert [e.id for e in parse_device_allocated(ann[keys.DEVICE_ALLOCATED])["gpu"]] == [H100[0]]
    assert wait_for(lambda: chosen_events(rig, "late"))


def test_an_agent_killed_before_the_write_writes_it_when_it_is_back(fake_api_thread: FakeApiServer) -> None:
    """SIGKILLed right after Allocate answered: no checkpoint, only the served journal holds it."""
    node = AgentNode(fake_api_thread)
    try:
        node.start_agent()
        fake_api_thread.inject_fault("PATCH", r"/pods/killed$", status=503, times=None)
        pod = node.put_pod(pod_doc("killed", {"main": {"nvidia.com/gpu": "2"}}, None))
        got = node.kubelet.admit(pod)["main"]["nvidia.com/gpu"]
        node.kill_agent()
        fake_api_thread.clear_faults()
        assert keys.ALLOCATED_NODE not in (
            fake_api_thread.get("pods", "killed", "default")["metadata"].get("annotations") or {}
        )
        node.start_agent()

        def annotation() -> dict[str, str] | None:
            ann = fake_api_thread.get("pods", "killed", "default")["metadata"].get("annotations") or {}
            return ann if ann.get(keys.ALLOCATED_NODE) == node.name else None

        assert wait_for(annotation, timeout=15)
        ann = annotation() or {}
        assert sorted(e.id for e in parse_device_allocated(ann[keys.DEVICE_ALLOCATED])["gpu"]) == sorted(
            got.ids
        )
    finally:
        node.close()
