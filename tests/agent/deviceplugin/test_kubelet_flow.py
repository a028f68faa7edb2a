"""The agent as kubelet's device plugin, end to end: the stand-in kubelet registers its plugins,
watches their devices and admits pods from the fake API server; each case checks the exact device
IDs, device nodes, environment and CDI names a container receives."""

from __future__ import annotations

import re

import pytest

from tests.agent.deviceplugin.rig import CONTROL, allocated, gpu_entry, pod_doc, rdma_entry
from tests.agent.support import wait_for as _wait  # also imported from here by sibling tests
from tests.support.kubelet import AdmissionError

H100 = {
    0: "GPU-4cdf9947-cefe-3cb6-c351-2f12d2e0065d",
    1: "GPU-a83caf4c-033b-45e1-5436-1c196ddaa0fa",
    2: "GPU-f6f52592-bac6-88cd-e124-1fcd1ae835b3",
    3: "GPU-ed684765-53fb-d6ad-d0f8-2d84dc86b55c",
    4: "GPU-c358579b-e9bb-09ac-cc37-bc237ce60f44",
    5: "GPU-3c4a0919-b433-6f3e-8d59-8342049990f2",
    6: "GPU-0db905d6-73ee-87dd-bafc-aeef0e86cbb1",
    7: "GPU-25f888c1-9820-a872-af50-9abbaea60f70",
}
A100_PAIRS = {2: "GPU-c5934fc0-0000-0000-0000-000000000000", 3: "GPU-b6f04d55-0000-0000-0000-000000000000"}
L40S_5 = "GPU-ea6e7f13-25e2-a415-28c0-a14143efb073"


def control(dev) -> list[tuple[str, str, str]]:
    return [(f"/dev/{c}", f"{dev}/{c}", "rw") for c in CONTROL]


def gpu_nodes(dev, minors) -> list[tuple[str, str, str]]:
    return [(f"/dev/nvidia{m}", f"{dev}/nvidia{m}", "rw") for m in minors] + control(dev)


def test_registration_and_device_lists(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    assert sorted(r for _, _, r in kubelet.registrations) == [
        "koordinator.sh/gpu",
        "koordinator.sh/gpu-core",
        "koordinator.sh/rdma",
        "nvidia.com/gpu",
    ]
    assert {v for v, _, _ in kubelet.registrations} == {"v1beta1"}
    assert ("v1beta1", "topoalloc-nvidia.com-gpu.sock", "nvidia.com/gpu") in kubelet.registrations
    gpus = kubelet.plugins["nvidia.com/gpu"].devices
    assert gpus == {uuid: ("Healthy", 0 if m < 4 else 1) for m, uuid in H100.items()}
    cores = kubelet.plugins["koordinator.sh/gpu-core"].devices
    assert len(cores) == 800 and cores[H100[5] + "-u42"] == ("Healthy", 1)
    rdma = kubelet.plugins["koordinator.sh/rdma"].devices
    assert len(rdma) == 1200 and rdma["0000:18:00.0-u00"] == ("Healthy", 0)
    # kubelet owns the served resources now: the agent no longer writes them on the Node
    node = rig.server.get("nodes", "gpu-node")
    assert "koordinator.sh/gpu-core" not in node["status"]["capacity"]
    assert "koordinator.sh/rdma" not in node["status"]["capacity"]
    assert "koordinator.sh/gpu" not in node["status"]["capacity"]
    assert node["status"]["capacity"]["koordinator.sh/gpu-memory-ratio"] == "800"


def test_whole_gpu(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    pod = rig.put_pod("one", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(3, H100[3])]))
    got = kubelet.admit(pod)["main"]["nvidia.com/gpu"]
    assert got.ids == [H100[3]]
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": H100[3]}
    assert got.devices == gpu_nodes(rig.dev, [3])
    assert got.cdi == []
    assert ("GetPreferredAllocation", "nvidia.com/gpu") in kubelet.calls


def test_nvlink_pair(make_rig) -> None:
    rig = make_rig("a100-pcie-4x-nvlink-pairs")
    kubelet = rig.start_kubelet()
    rig.start_agent(wait_for=("nvidia.com/gpu", "koordinator.sh/gpu-core"))
    entries = [gpu_entry(2, memory="80Gi"), gpu_entry(3, memory="80Gi")]  # no `id`: before PreBind fills it
    pod = rig.put_pod("pair", {"main": {"nvidia.com/gpu": "2"}}, allocated(entries))
    got = kubelet.admit(pod)["main"]["nvidia.com/gpu"]
    assert sorted(got.ids) == sorted(A100_PAIRS.values())
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": f"{A100_PAIRS[2]},{A100_PAIRS[3]}"}
    assert got.devices == gpu_nodes(rig.dev, [2, 3])


def test_eight_gpus_with_cdi(make_rig) -> None:
    rig = make_rig("dgx-h100")
    # the shape `nvidia-ctk cdi generate --device-name-strategy=uuid` writes
    devices = "".join(
        f"  - name: {uuid}\n    containerEdits:\n      deviceNodes:\n      - path: /dev/nvidia{m}\n"
        for m, uuid in H100.items()
    )
    (rig.cdi / "nvidia.yaml").write_text(f"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n{devices}")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    pod = rig.put_pod(
        "eight", {"main": {"nvidia.com/gpu": "8"}}, allocated([gpu_entry(m, H100[m]) for m in range(8)])
    )
    got = kubelet.admit(pod)["main"]["nvidia.com/gpu"]
    assert sorted(got.ids) == sorted(H100.values())
    assert got.cdi == [f"nvidia.com/gpu={H100[m]}" for m in range(8)]
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert got.devices == []


def test_cdi_names_by_index(make_rig) -> None:
    rig = make_rig("dgx-h100")
    devices = "".join(
        f"  - name: '{m}'\n    containerEdits:\n      deviceNodes:\n      - path: /dev/nvidia{m}\n"
        for m in range(8)
    )
    all_dev = "  - name: all\n    containerEdits:\n      deviceNodes:\n" + "".join(
        f"      - path: /dev/nvidia{m}\n" for m in range(8)
    )
    (rig.cdi / "nvidia.yaml").write_text(
        f"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n{devices}{all_dev}"
    )
    kubelet = rig.start_kubelet()
    rig.start_agent()
    pod = rig.put_pod("two", {"main": {"nvidia.com/gpu": "2"}}, allocated([gpu_entry(4), gpu_entry(6)]))
    got = kubelet.admit(pod)["main"]["nvidia.com/gpu"]
    assert got.cdi == ["nvidia.com/gpu=4", "nvidia.com/gpu=6"]


def test_half_gpu(make_rig) -> None:
    rig = make_rig("l40s-8x-pcie")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    pod = rig.put_pod(
        "half",
        {"main": {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}},
        allocated([gpu_entry(5, L40S_5, core=50, memory="46068Mi")]),
    )
    got = kubelet.admit(pod)["main"]["koordinator.sh/gpu-core"]
    assert sorted(got.ids) == [f"{L40S_5}-u{k:02d}" for k in range(50)]
    assert got.envs == {
        "NVIDIA_VISIBLE_DEVICES": L40S_5,
        "CUDA_DEVICE_MEMORY_LIMIT_0": "23034m",  # half of 46068 MiB
        "CUDA_DEVICE_SM_LIMIT": "50",
    }
    assert got.devices == gpu_nodes(rig.dev, [5])
    # the other half of the same GPU goes to the next pod that was placed there
    other = rig.put_pod(
        "other-half",
        {"main": {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}},
        allocated([gpu_entry(5, L40S_5, core=50, memory="46068Mi")]),
    )
    got2 = kubelet.admit(other)["main"]["koordinator.sh/gpu-core"]
    assert sorted(got2.ids) == [f"{L40S_5}-u{k:02d}" for k in range(50, 100)]


def test_gpu_and_vf_joint(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    pod = rig.put_pod(
        "joint",
        {"main": {"nvidia.com/gpu": "1", "koordinator.sh/rdma": "1"}},
        allocated([gpu_entry(0, H100[0])], [rdma_entry(0, "0000:18:00.0", "0000:18:00.2")]),
    )
    got = kubelet.admit(pod)["main"]
    assert got["nvidia.com/gpu"].ids == [H100[0]]
    assert got["nvidia.com/gpu"].envs == {"NVIDIA_VISIBLE_DEVICES": H100[0]}
    nic = got["koordinator.sh/rdma"]
    assert nic.ids == ["0000:18:00.0-u00"]
    assert nic.envs == {"PCIDEVICE_KOORDINATOR_SH_RDMA": "0000:18:00.2"}
    assert nic.devices == [
        ("/dev/infiniband/rdma_cm", f"{rig.dev}/infiniband/rdma_cm", "rw"),
        ("/dev/infiniband/uverbs13", f"{rig.dev}/infiniband/uverbs13", "rw"),  # the VF's, from sysfs
    ]


def test_rdma_same_pcie_gives_more_nics_than_units(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    pod = rig.put_pod(
        "two-nics",
        {"main": {"nvidia.com/gpu": "2", "koordinator.sh/rdma": "1"}},
        allocated(
            [gpu_entry(4, H100[4]), gpu_entry(5, H100[5])],
            [rdma_entry(6, "0000:9a:00.0", "0000:9a:00.1"), rdma_entry(9, "0000:c0:00.0", "0000:c0:00.3")],
        ),
    )
    nic = kubelet.admit(pod)["main"]["koordinator.sh/rdma"]
    assert nic.ids == ["0000:9a:00.0-u00"]
    assert nic.envs == {"PCIDEVICE_KOORDINATOR_SH_RDMA": "0000:9a:00.1,0000:c0:00.3"}
    assert nic.devices == [
        ("/dev/infiniband/rdma_cm", f"{rig.dev}/infiniband/rdma_cm", "rw"),
        ("/dev/infiniband/uverbs28", f"{rig.dev}/infiniband/uverbs28", "rw"),
        ("/dev/infiniband/uverbs34", f"{rig.dev}/infiniband/uverbs34", "rw"),
    ]


def test_two_pods_back_to_back_same_request(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    a = rig.put_pod("pod-a", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(6, H100[6])]))
    b = rig.put_pod("pod-b", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(1, H100[1])]))
    got_a = kubelet.admit(a)["main"]["nvidia.com/gpu"]
    got_b = kubelet.admit(b)["main"]["nvidia.com/gpu"]
    assert got_a.ids == [H100[6]] and got_a.envs == {"NVIDIA_VISIBLE_DEVICES": H100[6]}
    assert got_b.ids == [H100[1]] and got_b.envs == {"NVIDIA_VISIBLE_DEVICES": H100[1]}
    served = rig.plugins.admission.served
    assert {s.name: s.resources for s in served.values()} == {
        "pod-a": {"nvidia.com/gpu": [[H100[6]]]},
        "pod-b": {"nvidia.com/gpu": [[H100[1]]]},
    }


def test_two_containers_split_the_annotation(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    pod = rig.put_pod(
        "split",
        {"trainer": {"nvidia.com/gpu": "2"}, "helper": {"nvidia.com/gpu": "1"}},
        allocated([gpu_entry(2, H100[2]), gpu_entry(3, H100[3]), gpu_entry(7, H100[7])]),
    )
    got = kubelet.admit(pod)
    assert sorted(got["trainer"]["nvidia.com/gpu"].ids) == sorted([H100[2], H100[3]])
    assert got["helper"]["nvidia.com/gpu"].ids == [H100[7]]


@pytest.mark.parametrize(
    ("annotation", "reason"),
    [
        ("{not json", "malformed annotation"),
        ('{"gpu":[{"minor":"three"}]}', "malformed annotation"),
        (allocated([gpu_entry(9)]), "this node has no GPU with minor 9"),
        (allocated([gpu_entry(2, H100[5])]), f"GPU 2 is {H100[2]} here, the annotation says {H100[5]}"),
        (
            allocated([gpu_entry(2), gpu_entry(3)]),
            "nvidia.com/gpu: the pod requests 1, the annotation allocates 2",
        ),
        (allocated([gpu_entry(2, core=50)]), "nvidia.com/gpu needs whole GPUs"),
        (allocated(rdma=[rdma_entry(0, "0000:18:00.0", None)]), "annotation has no gpu devices"),
    ],
)
def test_bad_annotation_is_refused_with_an_event(make_rig, annotation, reason) -> None:
    _refused_with_an_event(make_rig, annotation, reason)


def test_without_node_choice_a_pod_without_annotation_is_refused(make_rig) -> None:
    """The node's own choice turned off (`--no-node-choice`): fail closed, as before it existed."""
    _refused_with_an_event(
        make_rig, None, "no scheduling.koordinator.sh/device-allocated annotation", choose_on_node=False
    )


def _refused_with_an_event(make_rig, annotation, reason, *, choose_on_node: bool = True) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent(wait_for=("nvidia.com/gpu",), choose_on_node=choose_on_node)
    pod = rig.put_pod("bad", {"main": {"nvidia.com/gpu": "1"}}, annotation)
    with pytest.raises(AdmissionError) as err:
        kubelet.admit(pod)
    assert "pod default/bad" in str(err.value) and reason in str(err.value)
    assert kubelet.allocations == {}
    events = rig.events("DeviceAllocationRefused")
    assert len(events) == 1
    assert events[0]["involvedObject"]["name"] == "bad" and events[0]["type"] == "Warning"
    assert reason in events[0]["message"]
    # a well-annotated pod right after it is still served
    good = rig.put_pod("good", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(4, H100[4])]))
    rig.server.remove("pods", "bad", "default")
    assert kubelet.admit(good)["main"]["nvidia.com/gpu"].ids == [H100[4]]


def test_vf_of_another_nic_is_refused(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    pod = rig.put_pod(
        "wrong-vf",
        {"main": {"koordinator.sh/rdma": "1"}},
        allocated(rdma=[rdma_entry(0, "0000:18:00.0", "0000:40:00.2")]),
    )
    with pytest.raises(AdmissionError, match=re.escape("VF 0000:40:00.2 is not a VF of 0000:18:00.0")):
        kubelet.admit(pod)


def test_device_turned_unhealthy(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    assert rig.agent is not None and rig.fx is not None
    assert _wait(lambda: rig.agent.events.ready.is_set())
    rig.fx.nvml.emit(6, 48)  # double-bit ECC Xid on GPU 6
    devices = kubelet.wait_devices("nvidia.com/gpu", lambda d: d[H100[6]][0] == "Unhealthy", timeout=10)
    assert [u for u, (h, _) in devices.items() if h != "Healthy"] == [H100[6]]
    cores = kubelet.wait_devices(
        "koordinator.sh/gpu-core", lambda d: d[H100[6] + "-u00"][0] == "Unhealthy", 10
    )
    assert sum(1 for h, _ in cores.values() if h == "Unhealthy") == 100
    # a pod the allocator placed on GPU 6 before it failed is refused, not moved to another GPU
    pod = rig.put_pod("late", {"main": {"nvidia.com/gpu": "1"}}, allocated([gpu_entry(6, H100[6])]))
    with pytest.raises(AdmissionError, match=r"the allocator chose \['" + H100[6]):
        kubelet.admit(pod)


def test_lost_gpu_and_nic_port_down_stream_as_unhealthy(make_rig, tmp_path) -> None:
    from tests.agent.support import copy_fixture

    rig = make_rig("dgx-h100")
    rig.fixture_dir = copy_fixture("dgx-h100", tmp_path)
    kubelet = rig.start_kubelet()
    agent = rig.start_agent()
    assert rig.fx is not None

    def down(devices) -> set[str]:
        return {i.rsplit("-u", 1)[0] for i, (h, _) in devices.items() if h != "Healthy"}

    # the fixture's two storage NICs (ports not cabled, as recorded) are unhealthy from the start
    already = down(kubelet.plugins["koordinator.sh/rdma"].devices)
    assert already == {"0000:29:00.0", "0000:29:00.1", "0000:aa:00.0", "0000:aa:00.1"}
    rig.fx.nvml.lose(2)  # GPU 2 fell off the bus
    state = next(rig.fixture_dir.glob("sys/devices/**/0000:18:00.0/infiniband/mlx5_0/ports/1/state"))
    state.write_text("1: DOWN\n")
    agent.request_resync()
    gpus = kubelet.wait_devices("nvidia.com/gpu", lambda d: d[H100[2]][0] == "Unhealthy", timeout=10)
    assert [u for u, (h, _) in gpus.items() if h != "Healthy"] == [H100[2]]
    nics = kubelet.wait_devices("koordinator.sh/rdma", lambda d: d["0000:18:00.0-u00"][0] == "Unhealthy", 10)
    assert down(nics) == already | {"0000:18:00.0"}
    # and back: the port comes up, the NIC is healthy again without a restart
    state.write_text("4: ACTIVE\n")
    agent.request_resync()
    kubelet.wait_devices("koordinator.sh/rdma", lambda d: d["0000:18:00.0-u00"][0] == "Healthy", 10)


def test_a_pod_with_an_unknown_annotation_key_gets_one_warning_event(make_rig) -> None:
    """The agent serves the pod as annotated and tells, once for the whole pod, what it says that
    topoalloc ignores (the same sentence as the extender's and the webhooks')."""
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    doc = pod_doc(
        "typo",
        {"a": {"nvidia.com/gpu": "1"}, "b": {"nvidia.com/gpu": "1"}},
        allocated([gpu_entry(0, H100[0]), gpu_entry(1, H100[1])]),
    )
    doc["metadata"]["annotations"]["topoalloc.io/requred-topology"] = "topology.kubernetes.io/zone"
    got = kubelet.admit(rig.server.put(doc))
    assert got["a"]["nvidia.com/gpu"].ids == [H100[0]] and got["b"]["nvidia.com/gpu"].ids == [H100[1]]
    (event,) = rig.events("IgnoredPodSettings")
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "typo"
    assert event["message"] == (
        "unknown annotation topoalloc.io/requred-topology (did you mean topoalloc.io/required-topology?): "
        "topoalloc ignores it"
    )
    assert rig.events("DeviceAllocationRefused") == []
