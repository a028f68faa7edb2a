"""Which pod kubelet is admitting: named by kubelet's PodResources list, never guessed from the
order pods were created or bound. Pods with the same request admitted in any order each get their
own annotated devices; without PodResources, a lone waiting pod is still served and two are refused."""

from __future__ import annotations

import random
import time

import pytest
from prometheus_client import REGISTRY

from agent.deviceplugin.identity import Unidentified, from_kubelet, without_kubelet
from tests.agent.deviceplugin.rig import allocated, gpu_entry, pod_doc, rdma_entry
from tests.agent.deviceplugin.test_kubelet_flow import H100
from tests.support.kubelet import AdmissionError

GPU = "nvidia.com/gpu"
RDMA = "koordinator.sh/rdma"


def _pod(name: str, containers: dict[str, dict[str, str]], phase: str = "Pending") -> dict:
    doc = pod_doc(name, containers, allocated([gpu_entry(0)]))
    doc["status"]["phase"] = phase
    doc["metadata"]["uid"] = f"uid-{name}"
    return doc


# -- the rule, on plain data -------------------------------------------------------------------
def test_the_listed_container_without_devices_is_the_one_being_admitted() -> None:
    a = _pod("a", {"main": {GPU: "1"}})
    b = _pod("b", {"main": {GPU: "1"}})
    kubelet = {"default/a": {"main": {GPU: [H100[0]]}}, "default/b": {"main": {}}}
    hit = from_kubelet(GPU, kubelet, [a, b])
    assert hit.pod["metadata"]["name"] == "b" and hit.container == 0 and hit.count == 1


def test_second_container_of_a_pod_and_other_resources_already_held() -> None:
    pod = _pod("two", {"first": {GPU: "2"}, "second": {GPU: "1", RDMA: "1"}})
    kubelet = {"default/two": {"first": {GPU: ["x", "y"]}, "second": {RDMA: ["nic-u00"]}}}
    hit = from_kubelet(GPU, kubelet, [pod])
    assert (hit.container, hit.count) == (1, 1)
    with pytest.raises(Unidentified, match=f"no pod kubelet is admitting on this node requests {RDMA}"):
        from_kubelet(RDMA, kubelet, [pod])  # only `second` asks for RDMA, and it holds it


def test_pods_kubelet_does_not_list_or_that_run_are_not_candidates() -> None:
    waiting = _pod("waiting", {"main": {GPU: "1"}})  # bound, but kubelet has not got to it yet
    running = _pod("running", {"main": {GPU: "1"}}, phase="Running")
    admitting = _pod("admitting", {"main": {GPU: "1"}})
    kubelet = {"default/running": {"main": {}}, "default/admitting": {"main": {}}}
    assert from_kubelet(GPU, kubelet, [waiting, running, admitting]).pod is admitting


def test_two_listed_pods_waiting_is_refused_not_guessed() -> None:
    a = _pod("a", {"main": {GPU: "1"}})
    b = _pod("b", {"main": {GPU: "1"}})
    with pytest.raises(
        Unidentified, match="cannot tell which pod kubelet is admitting: default/a, default/b"
    ):
        from_kubelet(GPU, {"default/a": {"main": {}}, "default/b": {"main": {}}}, [a, b])


def test_fallback_names_only_a_lone_waiting_pod() -> None:
    a = _pod("a", {"main": {GPU: "1"}})
    b = _pod("b", {"main": {GPU: "1"}})

    def served(pod: dict, container: int) -> bool:
        return pod["metadata"]["name"] == "a"

    assert without_kubelet(GPU, [a, b], served, "down").pod is b
    with pytest.raises(Unidentified, match=r"down; 2 pending pods on this node wait for nvidia\.com/gpu"):
        without_kubelet(GPU, [a, b], lambda p, i: False, "down")


# -- end to end: stand-in kubelet, real agent ------------------------------------------------
def test_same_request_admitted_younger_first_each_gets_its_own(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    older = rig.put_pod("older", {"main": {GPU: "1"}}, allocated([gpu_entry(6, H100[6])]))
    younger = rig.put_pod("younger", {"main": {GPU: "1"}}, allocated([gpu_entry(1, H100[1])]))
    # kubelet admits in the order the pods reach it, which need not be creation order
    assert kubelet.admit(younger)["main"][GPU].ids == [H100[1]]
    assert kubelet.admit(older)["main"][GPU].ids == [H100[6]]
    assert rig.plugins.checker.check() == []
    assert rig.plugins.admission.unidentified_fallbacks == 0


def test_gpu_and_vf_pairs_stay_paired_in_any_order(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    request = {"main": {GPU: "1", RDMA: "1"}}
    first = rig.put_pod(
        "pair-0", request, allocated([gpu_entry(0, H100[0])], [rdma_entry(0, "0000:18:00.0", "0000:18:00.2")])
    )
    second = rig.put_pod(
        "pair-4", request, allocated([gpu_entry(4, H100[4])], [rdma_entry(4, "0000:4f:00.0", "0000:4f:00.2")])
    )
    verbs = rig.plugins.grants.sysfs.uverbs_by_function()
    got4 = kubelet.admit(second)["main"]
    got0 = kubelet.admit(first)["main"]
    assert got0[GPU].ids == [H100[0]] and got4[GPU].ids == [H100[4]]
    assert got0[RDMA].ids == ["0000:18:00.0-u00"] and got4[RDMA].ids == ["0000:4f:00.0-u00"]
    assert got0[RDMA].envs == {"PCIDEVICE_KOORDINATOR_SH_RDMA": "0000:18:00.2"}
    assert got4[RDMA].envs == {"PCIDEVICE_KOORDINATOR_SH_RDMA": "0000:4f:00.2"}
    assert got4[RDMA].devices[1:] == [
        ("/dev/infiniband/" + v, f"{rig.dev}/infiniband/{v}", "rw") for v in verbs["0000:4f:00.2"]
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_eight_identical_pods_in_shuffled_order(make_rig, seed: int) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent(wait_for=(GPU,))
    minors = list(range(8))
    random.Random(seed).shuffle(minors)  # the allocator's choice per pod, in pod-name order
    pods = [
        rig.put_pod(f"m-{i}", {"main": {GPU: "1"}}, allocated([gpu_entry(m, H100[m])]))
        for i, m in enumerate(minors)
    ]
    order = list(range(8))
    random.Random(seed + 100).shuffle(order)
    for i in order:
        got = kubelet.admit(pods[i])["main"][GPU]
        assert got.ids == [H100[minors[i]]], f"m-{i}"
        assert got.envs == {"NVIDIA_VISIBLE_DEVICES": H100[minors[i]]}
    assert rig.plugins.checker.check() == []
    assert rig.events("DeviceAllocationMismatch") == []


def test_without_pod_resources_a_lone_pod_is_served_and_two_are_refused(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent(wait_for=(GPU,))
    kubelet.stop_pod_resources()
    lone = rig.put_pod("lone", {"main": {GPU: "1"}}, allocated([gpu_entry(2, H100[2])]))
    unnamed = (
        REGISTRY.get_sample_value("topoalloc_agent_admissions_without_pod_resources_total", {"resource": GPU})
        or 0.0
    )
    assert kubelet.admit(lone)["main"][GPU].ids == [H100[2]]
    assert rig.plugins.state()["namedWithoutPodResources"] == 1  # in GetPreferredAllocation; kept
    assert (
        REGISTRY.get_sample_value("topoalloc_agent_admissions_without_pod_resources_total", {"resource": GPU})
        == unnamed + 1
    )
    a = rig.put_pod("a", {"main": {GPU: "1"}}, allocated([gpu_entry(3, H100[3])]))
    rig.put_pod("b", {"main": {GPU: "1"}}, allocated([gpu_entry(5, H100[5])]))
    with pytest.raises(AdmissionError) as err:
        kubelet.admit(a)
    message = str(err.value)
    assert "cannot tell which pod kubelet is admitting: PodResources" in message
    assert "UNAVAILABLE" in message and "2 pending pods on this node wait for nvidia.com/gpu" in message


def test_allocate_uses_the_pod_named_by_get_preferred_allocation(make_rig) -> None:
    """kubelet is asked once per container, in GetPreferredAllocation: never while it holds the
    devices of an Allocate in flight (kubernetes/kubernetes#137534)."""
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent(wait_for=(GPU,))
    a = rig.put_pod("a", {"main": {GPU: "2"}}, allocated([gpu_entry(2, H100[2]), gpu_entry(3, H100[3])]))
    before = kubelet.pod_resources_lists
    assert sorted(kubelet.admit(a)["main"][GPU].ids) == sorted([H100[2], H100[3]])
    assert kubelet.pod_resources_lists - before == 1
    assert kubelet.calls[-2:] == [("GetPreferredAllocation", GPU), ("Allocate", GPU)]


def test_allocate_without_get_preferred_allocation_asks_kubelet_itself(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent(wait_for=(GPU,))
    kubelet.ask_preferred = False
    # kubelet picks in ID order: the pods are annotated with the GPUs it will pick, younger first
    ordered = sorted(H100.items(), key=lambda kv: kv[1])
    (m0, u0), (m1, u1) = ordered[0], ordered[1]
    first = rig.put_pod("first", {"main": {GPU: "1"}}, allocated([gpu_entry(m1, u1)]))
    second = rig.put_pod("second", {"main": {GPU: "1"}}, allocated([gpu_entry(m0, u0)]))
    before = kubelet.pod_resources_lists
    assert kubelet.admit(second)["main"][GPU].ids == [u0]
    assert kubelet.pod_resources_lists - before == 1
    # kubelet then offers u1 to `first`, its own: served. A stale GetPreferredAllocation answer
    # never names a pod: there was none.
    assert kubelet.admit(first)["main"][GPU].ids == [u1]
    assert ("GetPreferredAllocation", GPU) not in kubelet.calls


@pytest.mark.parametrize("why", ["other devices", "too old"])
def test_a_preferred_answer_that_no_longer_fits_is_not_used(make_rig, why: str) -> None:
    """GetPreferredAllocation named pod a, whose admission then stopped short of Allocate (kubelet
    restarted, say). The next Allocate, for pod b without a GetPreferredAllocation, is judged on
    kubelet's own list when kubelet's IDs are not a's annotated ones or the answer is 2 s old."""
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent(wait_for=(GPU,))
    lowest = min(H100, key=lambda m: H100[m])  # kubelet, asked nothing, takes the lowest ID
    other = next(m for m in H100 if m != lowest)
    a_gpu = other if why == "other devices" else lowest
    rig.put_pod("a", {"main": {GPU: "1"}}, allocated([gpu_entry(a_gpu, H100[a_gpu])]))
    admission = rig.plugins.admission
    kubelet.active["default/a"] = ["main"]
    assert admission.preferred(GPU, list(H100.values()), [], 1) == [H100[a_gpu]]
    kubelet.active.pop("default/a")  # kubelet dropped `a` before its Allocate
    if why == "too old":
        start = admission.clock()
        admission.clock = lambda: start + 2.5 + (time.monotonic() - start)
    spare = next(m for m in H100 if m not in (lowest, a_gpu))
    b = rig.put_pod("b", {"main": {GPU: "1"}}, allocated([gpu_entry(spare, H100[spare])]))
    kubelet.ask_preferred = False
    with pytest.raises(AdmissionError, match=r"pod default/b: kubelet asked for nvidia\.com/gpu"):
        kubelet.admit(b)
    assert admission.served == {}


def test_pod_resources_back_after_a_kubelet_restart_is_used_at_once(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent(wait_for=(GPU,))
    one = rig.put_pod("one", {"main": {GPU: "1"}}, allocated([gpu_entry(1, H100[1])]))
    assert kubelet.admit(one)["main"][GPU].ids == [H100[1]]
    kubelet.stop_pod_resources()
    kubelet.start_pod_resources()  # kubelet restarted: a new socket at the same path
    a = rig.put_pod("a", {"main": {GPU: "1"}}, allocated([gpu_entry(3, H100[3])]))
    b = rig.put_pod("b", {"main": {GPU: "1"}}, allocated([gpu_entry(5, H100[5])]))
    assert kubelet.admit(b)["main"][GPU].ids == [H100[5]]  # two wait: only PodResources can tell
    assert kubelet.admit(a)["main"][GPU].ids == [H100[3]]
    assert rig.plugins.admission.unidentified_fallbacks == 0
