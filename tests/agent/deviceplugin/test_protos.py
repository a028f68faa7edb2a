"""The checked-in gRPC stubs are exactly what `make protos` generates from the checked-in .proto
files, and they carry the kubelet's wire names (the method paths kubelet dials)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.deviceplugin.proto import deviceplugin_v1beta1_pb2 as pb
from agent.deviceplugin.proto import podresources_v1_pb2 as pr
from agent.deviceplugin.proto.generate import HERE, generate, stub_names


def test_checked_in_stubs_match_the_protos(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev dependency) regenerates the stubs")
    out = generate(tmp_path)
    for name in stub_names():
        assert (out / name).read_text() == (HERE / name).read_text(), f"{name} is stale: run `make protos`"


def test_wire_names() -> None:
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
