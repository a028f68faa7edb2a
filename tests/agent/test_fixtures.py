"""Every hardware fixture: its tree is exactly what its description composes, it produces its golden
Device CR, that CR validates against our CRD, and the facts each machine is about hold."""

from __future__ import annotations

import filecmp
import json
import os
from pathlib import Path

import jsonschema
import pytest
import yaml

from agent.fixtures.composer import compose
from agent.fixtures.topo_matrix import render
from apis.device import Device
from apis.dra import MODE_LABEL
from tests.agent.support import FIXTURE_NAMES, FIXTURES, REPO, device_doc, golden, one_pass

CRD = yaml.safe_load((REPO / "deploy/crds/devices.scheduling.koordinator.sh.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _tree(root: Path) -> dict[str, str]:
    """relative path -> "link:<target>" | "dir" | file content."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = path.read_text()
    return out


def test_the_issue_machines_are_all_here() -> None:
    assert set(FIXTURE_NAMES) >= {
        "dgx-h100",
        "l40s-8x-pcie",
        "rtx-a6000-nvlink-bridge",
        "l20-4x-vm-numa-unknown",
        "a100-pcie-4x-no-rdma",
        "a100-pcie-4x-nvlink-pairs",
        "cpu-only",
    }
    for name in FIXTURE_NAMES:
        readme = (FIXTURES / name / "README.md").read_text()
        assert "Source" in readme, f"{name}: README must say where each fact comes from"


@pytest.fixture(scope="module")
def composed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every fixture composed afresh from its machine.yaml, once per module."""
    out = {}
    for name in FIXTURE_NAMES:
        target = tmp_path_factory.mktemp("composed") / name
        target.mkdir()
        (target / "machine.yaml").write_text((FIXTURES / name / "machine.yaml").read_text())
        out[name] = compose(target)
    return out


def _empty_dirs(root: Path) -> list[str]:
    return sorted(
        str(Path(d).relative_to(root)) for d, dirs, files in os.walk(root) if not dirs and not files
    )


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_committed_tree_is_exactly_what_the_description_composes(
    name: str, composed: dict[str, Path]
) -> None:
    assert _tree(composed[name] / "sys") == _tree(FIXTURES / name / "sys")
    assert filecmp.cmp(composed[name] / "nvml.json", FIXTURES / name / "nvml.json", shallow=False)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_no_fixture_directory_is_empty(name: str, composed: dict[str, Path]) -> None:
    """Git stores no empty directory, so one here would be missing from a clone (CI) and the
    tree there would differ from the one composed on a developer's machine."""
    assert _empty_dirs(composed[name] / "sys") == [], "composer leaves empty directories"
    assert _empty_dirs(FIXTURES / name / "sys") == [], "checkout holds empty directories"


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_fixture_produces_its_golden_device(name: str) -> None:
    doc = device_doc(FIXTURES / name, node=name)
    assert doc == golden(name)
    jsonschema.validate(json.loads(json.dumps(doc)), SCHEMA)
    # and it decodes with the contract's own codec
    assert Device.from_dict(doc).name == name


def _by(doc: dict, kind: str) -> list[dict]:
    return [d for d in doc["spec"].get("devices", []) if d["type"] == kind]


def test_dgx_h100_one_nvlink_domain_switch_pairs_and_two_numa_nodes() -> None:
    doc = device_doc(FIXTURES / "dgx-h100")
    gpus, nics = _by(doc, "gpu"), _by(doc, "rdma")
    assert len(gpus) == 8 and len(nics) == 12
    # one NVSwitch domain of 8: every GPU sees the 7 others through its 18 links
    assert {g["nvlink"]["domain"] for g in gpus} == {"nvlink0"}
    for g in gpus:
        assert g["nvlink"]["nvswitch"] is True
        assert {p["minor"] for p in g["nvlink"]["peers"]} == set(range(8)) - {g["minor"]}
        assert {p["links"] for p in g["nvlink"]["peers"]} == {18}
    # two NUMA nodes, four GPUs each, on sockets 0 and 1
    assert [g["topology"]["nodeID"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g["topology"]["socketID"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    # each GPU's PCIe switch is shared with exactly one NIC: the one the DGX H100 user guide pairs it with
    paired = {
        0: "mlx5_0",
        1: "mlx5_3",
        2: "mlx5_4",
        3: "mlx5_5",
        4: "mlx5_6",
        5: "mlx5_9",
        6: "mlx5_10",
        7: "mlx5_11",
    }
    for g in gpus:
        switch = g["topology"]["pcieSwitchID"]
        sharing = [n["labels"]["ibdev"] for n in nics if n["topology"].get("pcieSwitchID") == switch]
        assert sharing == [paired[g["minor"]]], g["minor"]
        assert g["topology"]["pcieID"] == next(
            n["topology"]["pcieID"] for n in nics if n["labels"]["ibdev"] == paired[g["minor"]]
        )
    # the compute NICs carry their 4 VFs; the storage ports are not cabled
    for n in nics:
        vfs = [vf["busID"] for grp in n.get("vfGroups", []) for vf in grp["vfs"]]
        if n["labels"]["ibdev"] in paired.values():
            assert n["health"] is True and len(vfs) == 4 and n["labels"]["speedGbps"] == "400"
        else:
            assert n["health"] is False and vfs == []
            assert n["conditions"][0]["reason"] == "PortDown"
    assert doc["metadata"]["labels"]["node.koordinator.sh/gpu-partition-policy"] == "Honor"


def _published_rows(data_file: str) -> dict[str, list[str]]:
    """Rows of a published `nvidia-smi topo -m` kept under tests/agent/data: name -> cells."""
    published = {}
    for line in (Path(__file__).parent / "data" / data_file).read_text().splitlines():
        if line and not line.startswith("#"):
            name, *cells = line.split()
            published[name] = cells
    assert published, f"no published rows in {data_file}"
    return published


def test_dgx_h100_matrix_matches_the_published_nvidia_smi_rows() -> None:
    """tests/agent/data/dgx-h100-topo-m.txt: rows of `nvidia-smi topo -m` published for a DGX H100
    (vllm-project/vllm#6746); the rendered matrix must agree cell for cell."""
    published = _published_rows("dgx-h100-topo-m.txt")
    rendered = {}
    for line in render(Device.from_dict(device_doc(FIXTURES / "dgx-h100"))).splitlines()[1:21]:
        name, *cells = line.split()
        rendered[name] = cells[:20]
    for name, cells in published.items():
        assert rendered[name] == cells, name


def test_numa_unknown_is_kept_as_minus_one() -> None:
    doc = device_doc(FIXTURES / "l20-4x-vm-numa-unknown")
    devices = doc["spec"]["devices"]
    assert len(devices) == 5
    for dev in devices:
        assert dev["topology"]["nodeID"] == -1, dev
        assert dev["topology"]["socketID"] == -1
    # unknown NUMA is not "NUMA 0": nothing claims to share a NUMA node
    text = render(Device.from_dict(doc))
    assert "NODE" not in text.split("Legend")[0] and "N/A" in text


def test_l40s_gpus_two_numa_nodes_and_the_nic_of_unknown_numa() -> None:
    doc = device_doc(FIXTURES / "l40s-8x-pcie")
    gpus, nics = _by(doc, "gpu"), _by(doc, "rdma")
    assert [g["topology"]["nodeID"] for g in gpus] == [0] * 4 + [1] * 4
    assert all("nvlink" not in g for g in gpus)
    assert nics[0]["topology"]["nodeID"] == -1
    rows = render(Device.from_dict(doc)).splitlines()
    nic_row = next(r for r in rows if r.startswith("NIC0"))
    assert nic_row.split()[1:9] == ["SYS"] * 8  # as the published matrix shows


def test_nvlink_bridge_pair_is_its_own_domain() -> None:
    doc = device_doc(FIXTURES / "rtx-a6000-nvlink-bridge")
    gpus = _by(doc, "gpu")
    assert gpus[0]["nvlink"] == {"domain": "nvlink0", "peers": [{"minor": 1, "links": 4}]}
    assert gpus[1]["nvlink"] == {"domain": "nvlink0", "peers": [{"minor": 0, "links": 4}]}
    assert "nvlink" not in gpus[2]
    table = json.loads(doc["metadata"]["annotations"]["scheduling.koordinator.sh/gpu-partitions"])
    assert table["2"] == [
        {"minors": [0, 1], "gpuLinkType": "NVLink", "ringBusBandwidth": "56250M", "allocationScore": 1}
    ]
    assert doc["metadata"]["labels"]["node.koordinator.sh/gpu-partition-policy"] == "Prefer"
    # GPU2 and the NICs share a root complex (PHB), the bridged pair reaches them across host bridges
    rows = {r.split()[0]: r.split()[1:6] for r in render(Device.from_dict(doc)).splitlines()[1:6]}
    assert rows["GPU2"] == ["NODE", "NODE", "X", "PHB", "PHB"]
    assert rows["NIC0"] == ["NODE", "NODE", "PHB", "X", "PIX"]


def test_a100_pcie_bridged_pairs_are_two_nvlink_domains_one_per_socket() -> None:
    """Issue machine (c): 4x A100 PCIe, NVLink bridges joining pairs, the pairs on different sockets."""
    doc = device_doc(FIXTURES / "a100-pcie-4x-nvlink-pairs")
    gpus = _by(doc, "gpu")
    assert len(gpus) == 4 and _by(doc, "rdma") == []
    assert [g["nvlink"]["peers"] for g in gpus] == [
        [{"minor": 1, "links": 12}],
        [{"minor": 0, "links": 12}],
        [{"minor": 3, "links": 12}],
        [{"minor": 2, "links": 12}],
    ]
    domains = [g["nvlink"]["domain"] for g in gpus]
    assert domains[0] == domains[1] != domains[2] == domains[3]
    assert [g["topology"]["nodeID"] for g in gpus] == [0, 0, 1, 1]
    assert [g["topology"]["socketID"] for g in gpus] == [0, 0, 1, 1]
    # a pair is the NVLink unit (12 links x 25 GB/s); all four only meet over PCIe and the sockets
    table = json.loads(doc["metadata"]["annotations"]["scheduling.koordinator.sh/gpu-partitions"])
    assert [(p["minors"], p["gpuLinkType"], p["ringBusBandwidth"]) for p in table["2"]] == [
        ([0, 1], "NVLink", "300G"),
        ([2, 3], "NVLink", "300G"),
    ]
    assert [(p["minors"], p["gpuLinkType"]) for p in table["4"]] == [([0, 1, 2, 3], "PCIe")]
    assert doc["metadata"]["labels"]["node.koordinator.sh/gpu-partition-policy"] == "Prefer"
    # the rendered matrix (GPU cells, then NUMA) is the published one
    rows = render(Device.from_dict(doc)).splitlines()[1:5]
    rendered = {r.split()[0]: r.split()[1:6] for r in rows}
    assert rendered == _published_rows("a100-pcie-nvlink-pairs-topo-m.txt")


def test_gpu_node_without_rdma_publishes_no_rdma_resource() -> None:
    result = one_pass(FIXTURES / "a100-pcie-4x-no-rdma")
    assert [d.type for d in result.device.devices] == ["gpu"] * 4
    assert result.extended["koordinator.sh/rdma"] is None
    assert result.extended["koordinator.sh/gpu-core"] == "400"


def test_cpu_only_node_publishes_an_empty_device_and_no_gpu_resources() -> None:
    result = one_pass(FIXTURES / "cpu-only")
    assert result.device.devices == []
    assert not result.snapshot.nvml_available
    assert "Library Not Found" in result.snapshot.nvml_reason
    assert set(result.extended.values()) == {None}
    # no GPU labels; only the mode the agent is configured for, whatever the node holds
    assert result.labels.pop(MODE_LABEL) == "device-plugin"
    assert set(result.labels.values()) == {None}


def test_dgx1_v100_cube_mesh_matches_the_published_link_counts() -> None:
    """Issue 21's machine: every GPU has six NVLinks spread over four peers as one or two links;
    the rendered matrix (GPU cells, then NUMA) is the published NV1/NV2 pattern."""
    doc = device_doc(FIXTURES / "dgx1-v100")
    gpus = _by(doc, "gpu")
    assert len(gpus) == 8 and len(_by(doc, "rdma")) == 4
    assert {g["nvlink"]["domain"] for g in gpus} == {"nvlink0"}  # one connected NVLink graph
    assert all(sum(p["links"] for p in g["nvlink"]["peers"]) == 6 for g in gpus)
    assert [g["topology"]["pcieSwitchID"] for g in gpus[::2]] == [
        "0000:03:00.0",
        "0000:08:00.0",
        "0000:82:00.0",
        "0000:87:00.0",
    ]
    rows = render(Device.from_dict(doc)).splitlines()[1:9]
    rendered = {r.split()[0]: [*r.split()[1:9], r.split()[13]] for r in rows}
    assert rendered == _published_rows("dgx1-v100-topo-m.txt")
