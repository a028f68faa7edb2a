"""The checked-in gRPC stubs are exactly what `make protos` generates from the checked-in .proto
files, and they carry the kubelet's wire names (the method paths kubelet dials)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2 as pb
from agent.deviceplugin.proto import podresources_v1_pb2 as pr
from agent.dra.proto import dra_v1_pb2, dra_v1beta1_pb2
from agent.dra.proto import pluginregistration_v1_pb2 as reg
from agent.protogen import PROTOS, REPO, generate, stub_names


@pytest.mark.parametrize("folder", sorted(PROTOS))
def test_checked_in_stubs_match_the_protos(tmp_path: Path, folder: str) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev dependency) regenerates the stubs")
    out = generate(tmp_path, folder)
    for name in stub_names(folder):
        assert (out / name).read_text() == (REPO / folder / name).read_text(), (
            f"{folder}/{name} is stale: run `make protos`"
        )


def test_device_plugin_wire_names() -> None:
    dp = pb.DESCRIPTOR.services_by_name
    assert [m.full_name for m in dp["Registration"].methods] == ["v1beta1.Registration.Register"]
    assert [m.name for m in dp["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert [m.name for m in pr.DESCRIPTOR.services_by_name["PodResourcesLister"].methods] == [
        "List",
        "GetAllocatableResources",
        "Get",
    ]
    # field numbers are the wire contract
    fields = {f.name: f.number for f in pb.ContainerAllocateResponse.DESCRIPTOR.fields}
    assert fields == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}


def test_dra_wire_names() -> None:
    # kubelet dials /<package>.<Service>/<Method>: the proto packages are kept as upstream has them
    for module, version in ((dra_v1_pb2, "v1"), (dra_v1beta1_pb2, "v1beta1")):
        service = module.DESCRIPTOR.services_by_name["DRAPlugin"]
        assert [m.full_name for m in service.methods] == [
            f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin.NodePrepareResources",
            f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin.NodeUnprepareResources",
        ]
        fields = {f.name: f.number for f in module.Device.DESCRIPTOR.fields}
        assert fields == {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4} | (
            {"share_id": 5} if version == "v1" else {}
        )
        assert {f.name: f.number for f in module.Claim.DESCRIPTOR.fields} == {
            "namespace": 1,
            "uid": 2,
            "name": 3,
        }
    registration = reg.DESCRIPTOR.services_by_name["Registration"]
    assert [m.full_name for m in registration.methods] == [
        "pluginregistration.Registration.GetInfo",
        "pluginregistration.Registration.NotifyRegistrationStatus",
    ]
    assert {f.name: f.number for f in reg.PluginInfo.DESCRIPTOR.fields} == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
