"""The agent's kubelet DRA plugin against the stand-in kubelet, over real gRPC on unix sockets:
registration and version choice, prepare handing out exactly the allocated devices' CDI IDs,
idempotence, the double-use guard, claims that are not what kubelet means, unprepare, and an agent
restart that keeps what was prepared."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from agent.dra import prepared as prepared_module
from agent.dra.cdi import CDI_KIND, ENV_GPUS, ENV_VFS
from agent.dra.plugin import DRA_SOCKET, SUPPORTED_VERSIONS, registration_socket_name
from agent.dra.proto import dra_v1_pb2, dra_v1_pb2_grpc
from apis import dra
from tests.agent.dra.rig import NODE, NS, DraRig, result
from tests.agent.support import wait_for
from tests.support import dra_kubelet
from tests.support.dra_kubelet import DraKubelet, PrepareError


def cdi_id(claim: dict[str, Any], device: str) -> str:
    return f"{CDI_KIND}={claim['metadata']['uid']}-{device}"


def cdi_spec(rig: DraRig, claim: dict[str, Any]) -> dict[str, Any]:
    return json.loads((rig.cdi / f"topoalloc.io-claim_{claim['metadata']['uid']}.json").read_text())


def direct(rig: DraRig) -> dra_v1_pb2_grpc.DRAPluginStub:
    """A v1 client of the plugin's DRA socket, for what kubelet itself never sends."""
    return dra_v1_pb2_grpc.DRAPluginStub(grpc.insecure_channel(f"unix://{rig.plugin_dir / DRA_SOCKET}"))


def prepare_direct(rig: DraRig, *claims: tuple[str, str]) -> dra_v1_pb2.NodePrepareResourcesResponse:
    return direct(rig).NodePrepareResources(
        dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=NS, uid=uid, name=name) for name, uid in claims]
        ),
        timeout=10,
    )


def test_registration_offers_v1_then_v1beta1_and_kubelet_takes_v1(rig: DraRig) -> None:
    assert rig.kubelet is not None
    ((driver, endpoint, offered, chosen),) = rig.kubelet.registrations
    assert driver == dra.DRIVER == "topoalloc.io"
    assert endpoint == str(rig.plugin_dir / "dra.sock")
    assert offered == SUPPORTED_VERSIONS == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
    assert chosen == "v1.DRAPlugin"
    assert (
        rig.registry / "topoalloc.io-reg.sock"
    ).is_socket() and registration_socket_name() == "topoalloc.io-reg.sock"
    # kubelet's NotifyRegistrationStatus reached the agent
    assert wait_for(lambda: rig.plugin.state()["registered"] is True)


def test_a_kubelet_that_only_knows_v1beta1_prepares_over_v1beta1(make_rig, monkeypatch) -> None:
    monkeypatch.setattr(
        dra_kubelet, "SERVICES", {"v1beta1.DRAPlugin": dra_kubelet.SERVICES["v1beta1.DRAPlugin"]}
    )
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    assert kubelet.registrations[0][3] == "v1beta1.DRAPlugin"
    pod, claim = rig.claim_pod("p", "c1", ["gpu-2"])
    assert kubelet.prepare(pod) == {"main": [cdi_id(claim, "gpu-2")]}


def test_a_kubelet_knowing_none_of_its_versions_refuses_the_plugin(make_rig, monkeypatch) -> None:
    monkeypatch.setattr(dra_kubelet, "SERVICES", {"v1alpha4.DRAPlugin": dra_kubelet.SERVICES["v1.DRAPlugin"]})
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent(wait=False)
    assert wait_for(lambda: kubelet.refusals, 10)
    assert "none of services supported by the plugin" in kubelet.refusals[0]
    assert dra.DRIVER not in kubelet.plugins
    # the agent was told, and says so on its health endpoint
    assert wait_for(lambda: "none of services" in rig.plugin.state()["error"], 5)
    assert rig.plugin.state()["registered"] is False


def test_prepare_returns_exactly_the_allocated_devices_and_writes_their_cdi_spec(rig: DraRig) -> None:
    assert rig.kubelet is not None
    pod = rig.pod("p", {"gpus": "c-gpus", "nic": "c-nic"}, {"train": ["gpus", "nic"], "sidecar": []})
    gpus = rig.put_claim(
        "c-gpus", [result("gpu-0", "a"), result("gpu-1", "b")], pod_uid=pod["metadata"]["uid"]
    )
    nic = rig.put_claim("c-nic", [result("rdma-0-vf-2", "vf")], pod_uid=pod["metadata"]["uid"])
    got = rig.kubelet.prepare(pod)
    assert got == {
        "train": [cdi_id(gpus, "gpu-0"), cdi_id(gpus, "gpu-1"), cdi_id(nic, "rdma-0-vf-2")],
        "sidecar": [],
    }
    info = rig.kubelet.cache[(NS, "c-gpus")]
    assert [(d.request_names, d.pool, d.device) for d in info.devices[dra.DRIVER]] == [
        (["a"], NODE, "gpu-0"),
        (["b"], NODE, "gpu-1"),
    ]
    spec = cdi_spec(rig, gpus)
    assert spec["cdiVersion"] >= "0.6.0" and spec["kind"] == "topoalloc.io/claim"
    devices = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    uid = gpus["metadata"]["uid"]
    assert [n["path"] for n in devices[f"{uid}-gpu-1"]] == [
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    uuids = [
        d.id for d in sorted(rig.plugin.preparer.device.devices, key=lambda d: d.minor) if d.type == "gpu"
    ]
    assert spec["containerEdits"]["env"] == [f"{ENV_GPUS}={uuids[0]},{uuids[1]}"]
    vf = cdi_spec(rig, nic)
    # the third VF of NIC 0 (0000:18:00.3) and its own uverbs device, found through sysfs
    assert vf["containerEdits"]["env"] == [f"{ENV_VFS}=0000:18:00.3"]
    assert [n["path"] for n in vf["devices"][0]["containerEdits"]["deviceNodes"]] == [
        "/dev/infiniband/rdma_cm",
        "/dev/infiniband/uverbs14",
    ]


def test_a_request_for_one_request_gets_only_its_devices(rig: DraRig) -> None:
    assert rig.kubelet is not None
    pod = rig.pod("p", {"c": "c1"})
    pod["spec"]["containers"] = [
        {"name": "a", "resources": {"claims": [{"name": "c", "request": "first"}]}},
        {"name": "b", "resources": {"claims": [{"name": "c", "request": "second"}]}},
    ]
    claim = rig.put_claim(
        "c1", [result("gpu-3", "first"), result("gpu-4", "second/sub")], pod_uid=pod["metadata"]["uid"]
    )
    assert rig.kubelet.prepare(pod) == {"a": [cdi_id(claim, "gpu-3")], "b": [cdi_id(claim, "gpu-4")]}
    # the /subrequest suffix is stripped: kubelet matches base request names
    assert rig.kubelet.cache[(NS, "c1")].devices[dra.DRIVER][1].request_names == ["second"]


def test_repeated_prepare_gets_the_same_answer(rig: DraRig) -> None:
    assert rig.kubelet is not None
    pod, claim = rig.claim_pod("p", "c1", ["gpu-5", "rdma-3"])
    first = rig.kubelet.prepare(pod)
    rig.kubelet.cache.clear()  # kubelet lost its state: it asks again
    assert rig.kubelet.prepare(pod) == first == {"main": [cdi_id(claim, "gpu-5"), cdi_id(claim, "rdma-3")]}
    assert [c[0] for c in rig.kubelet.calls] == ["NodePrepareResources"] * 2


def test_a_device_prepared_for_another_claim_is_refused(rig: DraRig) -> None:
    assert rig.kubelet is not None
    first, _ = rig.claim_pod("p1", "c1", ["gpu-6"])
    rig.kubelet.prepare(first)
    second, claim2 = rig.claim_pod("p2", "c2", ["gpu-7", "gpu-6"])
    with pytest.raises(
        PrepareError, match=r"ResourceClaim c2: .*device gpu-6 is already prepared for claim default/c1"
    ):
        rig.kubelet.prepare(second)
    assert not (rig.cdi / f"topoalloc.io-claim_{claim2['metadata']['uid']}.json").exists()
    rig.kubelet.unprepare(first)  # freed: now it may go to the second claim
    assert rig.kubelet.prepare(second) == {"main": [cdi_id(claim2, "gpu-7"), cdi_id(claim2, "gpu-6")]}


def test_other_drivers_and_other_pools_are_left_alone(rig: DraRig) -> None:
    assert rig.kubelet is not None
    pod = rig.pod("p", {"c": "c1"})
    claim = rig.put_claim(
        "c1",
        [
            result("gpu-0", driver="gpu.nvidia.com"),
            result("gpu-1", pool="another-node"),
            result("gpu-2"),
        ],
        pod_uid=pod["metadata"]["uid"],
    )
    # the stand-in kubelet only calls drivers it knows: this driver alone gets this claim
    answer = prepare_direct(rig, ("c1", claim["metadata"]["uid"])).claims[claim["metadata"]["uid"]]
    assert answer.error == ""
    assert [(d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in answer.devices] == [
        (NODE, "gpu-2", [cdi_id(claim, "gpu-2")])
    ]


def test_claims_that_are_not_what_kubelet_means_get_a_per_claim_error(rig: DraRig) -> None:
    good = rig.put_claim("good", [result("gpu-0")])
    replaced = rig.put_claim("replaced", [result("gpu-1")])
    unallocated = rig.put_claim("unallocated", [], allocated=False)
    unknown = rig.put_claim("unknown", [result("gpu-99")])
    foreign = rig.put_claim("foreign", [result("nvme-0")])
    sick = rig.put_claim("sick", [result("rdma-1")])  # mlx5_1 is down on this machine
    answer = prepare_direct(
        rig,
        ("good", good["metadata"]["uid"]),
        ("replaced", "00000000-0000-0000-0000-000000000000"),
        ("unallocated", unallocated["metadata"]["uid"]),
        ("unknown", unknown["metadata"]["uid"]),
        ("foreign", foreign["metadata"]["uid"]),
        ("sick", sick["metadata"]["uid"]),
        ("gone", "11111111-1111-1111-1111-111111111111"),
        ("", "22222222-2222-2222-2222-222222222222"),
    ).claims
    errors = {uid: a.error for uid, a in answer.items()}
    assert errors[good["metadata"]["uid"]] == ""
    assert "was replaced" in errors["00000000-0000-0000-0000-000000000000"]
    assert replaced["metadata"]["uid"] in errors["00000000-0000-0000-0000-000000000000"]
    assert "not allocated" in errors[unallocated["metadata"]["uid"]]
    assert errors[unknown["metadata"]["uid"]] == f"claim {NS}/unknown: node {NODE} has no device gpu-99"
    assert "nvme-0 is not a topoalloc.io device name" in errors[foreign["metadata"]["uid"]]
    assert "device rdma-1 is unhealthy" in errors[sick["metadata"]["uid"]]
    assert errors["11111111-1111-1111-1111-111111111111"] == f"claim {NS}/gone not found: it was deleted"
    assert "without namespace, name or UID" in errors["22222222-2222-2222-2222-222222222222"]
    # the failures left nothing prepared, and the plugin still serves
    assert set(rig.plugin.store.claims) == {good["metadata"]["uid"]}
    assert prepare_direct(rig, ("good", good["metadata"]["uid"])).claims[good["metadata"]["uid"]].error == ""


def test_unprepare_is_idempotent_and_an_unknown_claim_is_a_success(rig: DraRig) -> None:
    assert rig.kubelet is not None
    pod, claim = rig.claim_pod("p", "c1", ["gpu-0"])
    rig.kubelet.prepare(pod)
    spec = rig.cdi / f"topoalloc.io-claim_{claim['metadata']['uid']}.json"
    assert spec.exists()
    rig.kubelet.unprepare(pod)
    assert not spec.exists() and rig.plugin.store.claims == {}
    stub = direct(rig)
    for uid in (claim["metadata"]["uid"], "never-prepared"):  # again, and one never seen
        reply = stub.NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace=NS, uid=uid, name="c1")]
            ),
            timeout=10,
        )
        assert dict(reply.claims) == {uid: dra_v1_pb2.NodeUnprepareResourceResponse(error="")}


def test_prepare_is_checkpointed_before_it_answers(rig: DraRig) -> None:
    assert rig.kubelet is not None
    pod, claim = rig.claim_pod("p", "c1", ["gpu-0"])
    rig.kubelet.prepare(pod)
    store = prepared_module.PreparedClaims(rig.state)
    store.load()
    assert [d.device for d in store.claims[claim["metadata"]["uid"]].devices] == ["gpu-0"]


def test_a_restarted_agent_keeps_what_it_prepared(make_rig) -> None:
    rig = make_rig("dgx-h100")
    kubelet = rig.start_kubelet()
    rig.start_agent()
    pod, claim = rig.claim_pod("p", "c1", ["gpu-0", "rdma-0-vf-0"])
    before = kubelet.prepare(pod)
    spec = rig.cdi / f"topoalloc.io-claim_{claim['metadata']['uid']}.json"
    rig.stop_agent()
    spec.unlink()  # /var/run is a tmpfs: a reboot empties it
    rig.server.remove("resourceclaims", "c1", NS)  # the answer must come from the checkpoint
    rig.start_agent()  # a new plugin on the same checkpoint folder; kubelet sees a new socket
    kubelet.cache.clear()
    assert (
        direct(rig)
        .NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[dra_v1_pb2.Claim(namespace=NS, uid=claim["metadata"]["uid"], name="c1")]
            ),
            timeout=10,
        )
        .claims[claim["metadata"]["uid"]]
        .devices[0]
        .cdi_device_ids
        == before["main"][:1]
    )
    assert spec.exists()  # written again from the checkpoint
    # still guarded: gpu-0 belongs to c1 until it is unprepared
    other, _ = rig.claim_pod("p2", "c2", ["gpu-0"])
    with pytest.raises(PrepareError, match="already prepared for claim default/c1"):
        kubelet.prepare(other)
    # and what the earlier process prepared is unprepared by this one
    answer = direct(rig).NodeUnprepareResources(
        dra_v1_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=NS, uid=claim["metadata"]["uid"], name="c1")]
        ),
        timeout=10,
    )
    assert answer.claims[claim["metadata"]["uid"]].error == ""
    assert not spec.exists() and rig.plugin.store.claims == {}


def test_kubelet_sees_the_plugin_go_and_come_back(rig: DraRig) -> None:
    kubelet: DraKubelet | None = rig.kubelet
    assert kubelet is not None
    (rig.registry / registration_socket_name()).unlink()  # someone wiped the folder
    assert wait_for(lambda: len(kubelet.registrations) == 2, 10)  # served again, registered again
    pod, claim = rig.claim_pod("p", "c1", ["gpu-0"])
    assert kubelet.prepare(pod) == {"main": [cdi_id(claim, "gpu-0")]}


def test_the_agent_in_dra_mode_publishes_its_pool_and_labels_its_node(rig: DraRig) -> None:
    assert wait_for(lambda: rig.slices(), 10)
    (piece,) = rig.slices()
    names = [d["name"] for d in piece["spec"]["devices"]]
    assert names[:8] == [f"gpu-{i}" for i in range(8)] and "rdma-0-vf-3" in names
    # the Node is patched after the slices in a pass: wait for it rather than race it
    assert wait_for(
        lambda: (
            ((rig.server.get("nodes", NODE) or {}).get("metadata", {}).get("labels") or {}).get(
                dra.MODE_LABEL
            )
            == "dra"
        ),
        10,
    )
    node = rig.server.get("nodes", NODE)
    assert not any(k.startswith("koordinator.sh/") for k in node["status"]["allocatable"])
    # kubelet's registration of the plugin runs on its own, beside the publishing: wait for it too
    agent = rig.agent
    assert agent is not None
    assert wait_for(lambda: agent.health_state()["draPlugin"]["registered"] is True, 10)


def test_an_xid_takes_the_gpu_out_of_the_slices_at_once(rig: DraRig) -> None:
    assert wait_for(lambda: rig.slices(), 10) and rig.fx is not None and rig.agent is not None
    generation = rig.slices()[0]["spec"]["pool"]["generation"]
    assert wait_for(lambda: rig.agent.events.ready.is_set(), 10)
    rig.fx.nvml.emit(3, 79)  # fallen off the bus: the event triggers a pass (resync is 30 s here)
    assert wait_for(lambda: rig.slices()[0]["spec"]["pool"]["generation"] == generation + 1, 10)
    assert "gpu-3" not in {d["name"] for d in rig.slices()[0]["spec"]["devices"]}
    # and a claim kube-scheduler had already given gpu-3 is refused at prepare, with the reason
    pod, _ = rig.claim_pod("p", "c1", ["gpu-3"])
    assert rig.kubelet is not None
    with pytest.raises(PrepareError, match=r"device gpu-3 is unhealthy \(XidCriticalError\)"):
        rig.kubelet.prepare(pod)


def test_a_prepare_that_cannot_be_checkpointed_is_not_reported_done(rig: DraRig) -> None:
    assert rig.kubelet is not None
    pod, claim = rig.claim_pod("p", "c1", ["gpu-0"])
    good = rig.plugin.store.path
    blocker = rig.root / "not-a-dir"
    blocker.write_text("")
    rig.plugin.store.path = blocker / "dra-checkpoint.msgpack"  # the state folder is unusable
    with pytest.raises(PrepareError, match=r"checkpoint .* not written"):
        rig.kubelet.prepare(pod)
    assert rig.plugin.store.claims == {} and not list(rig.cdi.glob("*.json"))
    rig.plugin.store.path = good
    assert rig.kubelet.prepare(pod) == {"main": [cdi_id(claim, "gpu-0")]}
