"""Config file, the partition derivation and its vendor override, and the CLI without a cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agent.config import AgentConfig, ConfigError, load_config
from agent.publish.device_builder import device_object
from apis import keys
from tests.agent.support import FIXTURES, REPO, one_pass
from topoalloc.cli import main


def test_config_file_overrides_defaults(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "resyncSeconds": 5,
                "health": {"ignoredXids": [13, 43], "xidHoldSeconds": 30},
                "midTier": {"cpuThresholdRatio": 0.5, "prodPriorityMin": 8000},
                "vfGroupLabels": {"type": "rdma-vf"},
                "partitions": {"rules": [{"model": "H100.*", "policy": "Prefer"}]},
                "mode": "dra",
                "dra": {"maxVfsPerNic": 2, "unhealthyTaintEffect": "NoExecute"},
            }
        )
    )
    cfg = load_config(path)
    assert cfg.mode == "dra" and cfg.dra.max_vfs_per_nic == 2
    assert (
        cfg.dra.unhealthy_taint_effect == "NoExecute"
        and AgentConfig().dra.unhealthy_taint_effect == "NoSchedule"
    )
    assert cfg.resync_seconds == 5.0
    assert cfg.health.ignored_xids == (13, 43) and cfg.health.xid_hold_seconds == 30.0
    assert cfg.mid_tier.cpu_threshold_ratio == 0.5 and cfg.mid_tier.prod_priority_min == 8000
    assert cfg.vf_group_labels == {"type": "rdma-vf"}
    assert cfg.partition_rule("H100-80GB-HBM3") is not None and cfg.partition_rule("L40S") is None


@pytest.mark.parametrize(
    "content",
    [
        {"resyncSecond": 5},
        {"health": {"ignoredXid": [1]}},
        {"partitions": {"rules": [{"policy": "Honor"}]}},
        {"partitions": {"rules": [{"model": "X", "policy": "Always"}]}},
        {"partitions": {"rules": [{"model": "X", "table": '{"two": []}'}]}},
        {"udevSource": "systemd"},
        {"resyncSeconds": "abc"},
        {"health": {"ignoredXids": ["a"]}},
        {"health": {"ignoredXids": 5}},
        {"mode": "kubelet"},
        {"dra": {"maxVfsPerNic": -1}},
        {"dra": {"maxVfs": 1}},
        {"dra": {"unhealthyTaintEffect": "None"}},
    ],
)
def test_bad_config_is_a_clear_error(tmp_path: Path, content: dict) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(ConfigError):
        load_config(path)


def _table(doc: dict) -> dict:
    return json.loads(doc["metadata"]["annotations"][keys.GPU_PARTITIONS])


def test_derived_table_on_nvswitch_matches_the_builtin_hopper_layout() -> None:
    table = _table(device_object(one_pass(FIXTURES / "dgx-h100").device))
    assert [p["minors"] for p in table["2"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [p["minors"] for p in table["4"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [p["minors"] for p in table["8"]] == [list(range(8))]
    # 18 links x 25 GB/s per direction through the fabric
    assert {p["ringBusBandwidth"] for n in ("2", "4", "8") for p in table[n]} == {"450G"}
    assert {p["allocationScore"] for parts in table.values() for p in parts} == {1}


def test_vendor_rule_overrides_table_and_policy(tmp_path: Path) -> None:
    vendor = {"1": [{"minors": [0]}, {"minors": [7]}], "8": [{"minors": list(range(8))}]}
    path = tmp_path / "agent.yaml"
    path.write_text(
        yaml.safe_dump(
            {"partitions": {"rules": [{"model": "H100-80GB-HBM3", "policy": "Prefer", "table": vendor}]}}
        )
    )
    doc = device_object(one_pass(FIXTURES / "dgx-h100", config=load_config(path)).device)
    assert _table(doc) == vendor
    assert doc["metadata"]["labels"][keys.GPU_PARTITION_POLICY] == "Prefer"


def test_once_print_outputs_the_device_then_the_node_patch() -> None:
    result = CliRunner().invoke(
        main, ["agent", "--once", "--print", "--fixture", str(FIXTURES / "dgx-h100"), "--node-name", "gpu-17"]
    )
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in docs] == ["Device", "Node"]
    assert docs[0]["metadata"]["name"] == docs[1]["metadata"]["name"] == "gpu-17"
    assert docs[1]["status"]["allocatable"]["koordinator.sh/rdma"] == "800"
    assert docs[1]["metadata"]["labels"][keys.GPU_MODEL] == "H100-80GB-HBM3"
    assert "nvidia.com/gpu" not in docs[1]["status"]["capacity"]  # the device plugin's


def test_once_print_in_dra_mode_adds_the_resource_slices() -> None:
    args = ["agent", "--once", "--print", "--fixture", str(FIXTURES / "dgx-h100"), "--node-name", "gpu-17"]
    result = CliRunner().invoke(main, [*args, "--mode", "dra"])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in docs] == ["Device", "Node", "ResourceSlice"]
    assert docs[1]["metadata"]["labels"]["topoalloc.io/device-mode"] == "dra"
    assert docs[1]["status"]["allocatable"] == {}  # no device resources: the slices say it
    assert docs[2]["spec"]["pool"]["name"] == "gpu-17" and len(docs[2]["spec"]["devices"]) == 52
    # as a server that keeps device taints holds it: the 4 NICs whose ports are down, tainted
    tainted = [d["name"] for d in docs[2]["spec"]["devices"] if d.get("taints")]
    assert len(tainted) == 4 and all(n.startswith("rdma-") for n in tainted)
    assert {t["effect"] for d in docs[2]["spec"]["devices"] for t in d.get("taints", ())} == {"NoSchedule"}


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--mode", "dra", "--device-plugin"], "a node in dra mode serves no device plugins"),
        (["--mode", "device-plugin", "--dra-plugin"], "a node in device-plugin mode serves no DRA plugin"),
        (["--mode", "kubelet"], "'kubelet' is not one of"),
    ],
)
def test_a_mode_and_the_other_modes_plugin_are_refused(flags: list[str], error: str) -> None:
    args = ["agent", "--once", "--print", "--fixture", str(FIXTURES / "dgx-h100")]
    result = CliRunner().invoke(main, [*args, *flags])
    assert result.exit_code == 2 and error in result.output, result.output


def test_inspect_prints_the_matrix_from_a_file(tmp_path: Path) -> None:
    out = CliRunner().invoke(
        main, ["agent", "--once", "--print", "--fixture", str(FIXTURES / "rtx-a6000-nvlink-bridge")]
    )
    path = tmp_path / "both.yaml"
    path.write_text(out.stdout)
    result = CliRunner().invoke(main, ["inspect", str(path)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["GPU0", "X", "NV4", "NODE", "NODE", "NODE", "1", "N/A"]
    assert "NIC0: mlx5_0 (0000:e2:00.0)  (unhealthy)" in result.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Device\nspec: {devices: [{type: gpu}]}\n")
    failed = CliRunner().invoke(main, ["inspect", str(bad)])
    assert failed.exit_code != 0 and "not a valid Device" in failed.output
    assert CliRunner().invoke(main, ["inspect"]).exit_code != 0


def test_bad_fixture_and_flags_are_reported(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["agent", "--once", "--print", "--fixture", str(tmp_path)])
    assert result.exit_code != 0 and "not a hardware fixture" in result.output
    result = CliRunner().invoke(main, ["agent", "--print", "--fixture", str(FIXTURES / "cpu-only")])
    assert result.exit_code != 0 and "--print needs --once" in result.output


def test_record_fixture_round_trip(tmp_path: Path) -> None:
    """record-fixture against a fixture standing in for a real machine: the recording reads back
    to the same Device, and holds only what the agent reads (symlinks kept as symlinks)."""
    out = tmp_path / "recorded"
    result = CliRunner().invoke(
        main,
        [
            "agent",
            "record-fixture",
            str(out),
            "--from-fixture",
            str(FIXTURES / "dgx-h100"),
            "--machine",
            "dgx",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "recorded 8 GPU(s)" in result.stdout
    assert device_object(one_pass(out).device) == device_object(one_pass(FIXTURES / "dgx-h100").device)
    assert (out / "sys/bus/pci/devices/0000:18:00.0").is_symlink()
    assert (out / "sys/class/infiniband/mlx5_0").is_symlink()
    assert (
        out / "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0/virtfn0"
    ).is_symlink()
    recorded = {p.relative_to(out / "sys") for p in (out / "sys").rglob("*")}
    source = {p.relative_to(FIXTURES / "dgx-h100/sys") for p in (FIXTURES / "dgx-h100/sys").rglob("*")}
    assert recorded == source


def test_the_console_script_runs() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "topoalloc",
            "agent",
            "--once",
            "--print",
            "--fixture",
            str(FIXTURES / "cpu-only"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "kind: Device" in result.stdout and "NVML Shared Library Not Found" in result.stderr
