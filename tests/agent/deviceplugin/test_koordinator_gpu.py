"""`koordinator.sh/gpu`, the GPU resource Koordinator's own documentation writes its pods with
(`koordinator.sh/gpu: 100` is one whole GPU, `50` half of one), served by the agent's device plugin
like `gpu-core`: 100 IDs per GPU, the container gets exactly its annotated GPU. Without it kubelet
would admit such a pod on the count the Node advertises and hand its container no GPU at all.
Shares of one GPU through `gpu-core` and `koordinator.sh/gpu` (two kubelet resources kubelet counts
apart) add up to one GPU at most."""

from __future__ import annotations

import json

import pytest

from apis import keys
from tests.agent.deviceplugin.rig import allocated, gpu_entry, rdma_entry
from tests.agent.deviceplugin.test_chosen_on_node import put, written
from tests.agent.deviceplugin.test_kubelet_flow import H100, L40S_5, gpu_nodes
from tests.support.kubelet import AdmissionError

KOORD_GPU = "koordinator.sh/gpu"
RDMA = "koordinator.sh/rdma"
CORE = {"koordinator.sh/gpu-core": "60", "koordinator.sh/gpu-memory-ratio": "60"}


def test_the_plugin_serves_koordinator_gpu_and_kubelet_owns_its_count(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    assert ("v1beta1", "topoalloc-koordinator.sh-gpu.sock", KOORD_GPU) in kubelet.registrations
    units = kubelet.plugins[KOORD_GPU].devices
    assert len(units) == 800 and units[H100[6] + "-u99"] == ("Healthy", 1)
    node = rig.server.get("nodes", "gpu-node")
    assert KOORD_GPU not in node["status"]["capacity"]  # kubelet writes it from the plugin's list


def test_koordinators_documented_pod_gets_its_gpu_and_vf(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    pod = rig.put_pod(
        "pod-vf01",
        {"container-vf": {KOORD_GPU: "100", RDMA: "100"}},
        allocated([gpu_entry(3, H100[3])], [rdma_entry(5, "0000:5e:00.0", "0000:5e:00.1", units=100)]),
    )
    got = kubelet.admit(pod)["container-vf"]
    gpu = got[KOORD_GPU]
    assert sorted(gpu.ids) == [f"{H100[3]}-u{k:02d}" for k in range(100)]
    assert gpu.envs == {"NVIDIA_VISIBLE_DEVICES": H100[3]}  # a whole GPU: no HAMi limits
    assert gpu.devices == gpu_nodes(rig.dev, [3])
    nic = got[RDMA]
    assert sorted(nic.ids) == [f"0000:5e:00.0-u{k:02d}" for k in range(100)]
    assert nic.envs == {"PCIDEVICE_KOORDINATOR_SH_RDMA": "0000:5e:00.1"}


def test_half_of_a_gpu_gets_hami_limits(make_rig) -> None:
    rig = make_rig("l40s-8x-pcie")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    pod = rig.put_pod(
        "half", {"main": {KOORD_GPU: "50"}}, allocated([gpu_entry(5, L40S_5, core=50, memory="46068Mi")])
    )
    got = kubelet.admit(pod)["main"][KOORD_GPU]
    assert sorted(got.ids) == [f"{L40S_5}-u{k:02d}" for k in range(50)]
    assert got.envs == {
        "NVIDIA_VISIBLE_DEVICES": L40S_5,
        "CUDA_DEVICE_MEMORY_LIMIT_0": "23034m",  # half of 46068 MiB
        "CUDA_DEVICE_SM_LIMIT": "50",
    }


def test_two_whole_gpus_in_hundreds(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    pod = rig.put_pod(
        "two", {"main": {KOORD_GPU: "200"}}, allocated([gpu_entry(4, H100[4]), gpu_entry(5, H100[5])])
    )
    got = kubelet.admit(pod)["main"][KOORD_GPU]
    assert sorted({i.rsplit("-u", 1)[0] for i in got.ids}) == sorted([H100[4], H100[5]])
    assert len(got.ids) == 200 and got.envs == {"NVIDIA_VISIBLE_DEVICES": f"{H100[4]},{H100[5]}"}


def test_shares_through_both_share_resources_add_up_to_one_gpu_at_most(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    a = rig.put_pod("a", {"main": CORE}, allocated([gpu_entry(2, H100[2], core=60)]))
    kubelet.admit(a)
    # 60 % through gpu-core and 60 % through koordinator.sh/gpu would be 120 % of GPU 2
    b = rig.put_pod("b", {"main": {KOORD_GPU: "60"}}, allocated([gpu_entry(2, H100[2], core=60)]))
    with pytest.raises(
        AdmissionError,
        match=r"already serve another pod \(default/a holds koordinator\.sh/gpu-core of the same GPU\)",
    ):
        kubelet.admit(b)
    # the 40 % left is served through either
    c = rig.put_pod("c", {"main": {KOORD_GPU: "40"}}, allocated([gpu_entry(2, H100[2], core=40)]))
    assert len(kubelet.admit(c)["main"][KOORD_GPU].ids) == 40
    # and a whole GPU of the other kind is refused on a GPU shared out this way
    d = rig.put_pod("d", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(2, H100[2])]))
    with pytest.raises(AdmissionError, match=r"already serve another pod \(default/[ac] holds koordinator"):
        kubelet.admit(d)


def test_a_whole_gpu_served_one_way_is_never_served_the_other(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    a = rig.put_pod("a", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(7, H100[7])]))
    kubelet.admit(a)
    b = rig.put_pod("b", {"main": {KOORD_GPU: "30"}}, allocated([gpu_entry(7, H100[7], core=30)]))
    with pytest.raises(AdmissionError, match=r"default/a holds nvidia\.com/gpu of the same GPU"):
        kubelet.admit(b)


def test_a_pod_without_allocation_gets_gpu_and_nic_chosen_on_the_node(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    joint = {
        keys.DEVICE_JOINT_ALLOCATE: json.dumps({"deviceTypes": ["gpu", "rdma"]}),
        keys.DEVICE_ALLOCATE_HINT: json.dumps({"rdma": {"vfSelector": {}}}),
    }
    pod = put(rig, "vf", {"main": {KOORD_GPU: "100", RDMA: "100"}}, joint)
    got = kubelet.admit(pod)["main"]
    (uuid,) = {i.rsplit("-u", 1)[0] for i in got[KOORD_GPU].ids}
    assert len(got[KOORD_GPU].ids) == 100
    minor = next(m for m, u in H100.items() if u == uuid)
    # the NIC behind the GPU's own PCIe switch (the fixture pairs GPU m with compute NIC m's switch)
    ann = json.loads(written(rig, "vf", 2)[keys.DEVICE_ALLOCATED])
    assert [e["minor"] for e in ann["gpu"]] == [minor]
    (nic,) = ann["rdma"]
    assert {i.rsplit("-u", 1)[0] for i in got[RDMA].ids} == {nic["id"]}
    assert got[RDMA].envs == {"PCIDEVICE_KOORDINATOR_SH_RDMA": nic["extension"]["vfs"][0]["busID"]}
    pcie = {d.minor: d.place.pcie_switch for d in rig.plugins.admission.inventory.gpus}
    nics = {n.minor: n.place.pcie_switch for n in rig.plugins.admission.inventory.nics}
    assert nics[nic["minor"]] == pcie[minor]


def test_a_pod_asking_two_gpu_kinds_cannot_be_chosen_for(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    pod = put(rig, "mixed", {"main": {KOORD_GPU: "100"}, "side": {"nvidia.com/gpu": "1"}})
    with pytest.raises(AdmissionError, match=r"asks both nvidia\.com/gpu and koordinator\.sh/gpu"):
        kubelet.admit(pod)
