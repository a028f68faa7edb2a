"""CDI specs as nvidia-ctk writes them: names by UUID or by index, `all` ignored, JSON and YAML, a
broken file skipped with a warning, changes picked up without a restart."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agent.deviceplugin.cdi import CdiRegistry


def _spec(devices: list[tuple[str, list[str]]], kind: str = "nvidia.com/gpu") -> dict:
    return {
        "cdiVersion": "0.6.0",
        "kind": kind,
        "devices": [
            {"name": n, "containerEdits": {"deviceNodes": [{"path": p} for p in paths]}}
            for n, paths in devices
        ],
    }


def test_names_by_uuid_then_by_device_node(tmp_path: Path, caplog) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "nvidia.json").write_text(
        json.dumps(
            _spec(
                [
                    ("GPU-aaa", ["/dev/nvidia0"]),
                    ("1", ["/dev/nvidia1"]),
                    ("all", ["/dev/nvidia0", "/dev/nvidia1"]),
                ]
            )
        )
    )
    (tmp_path / "b" / "other.yaml").write_text("kind: vendor.com/fpga\ndevices:\n- name: '2'\n")
    (tmp_path / "b" / "broken.yaml").write_text("kind: [unclosed\n")
    registry = CdiRegistry([str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "missing")])
    assert registry.gpu_names([(0, "GPU-aaa"), (1, "GPU-bbb")]) == [
        "nvidia.com/gpu=GPU-aaa",
        "nvidia.com/gpu=1",
    ]
    assert registry.gpu_names([(2, "GPU-ccc")]) is None  # no spec for GPU 2: the caller uses /dev nodes
    assert registry.gpu_names([(0, "GPU-aaa"), (2, "GPU-ccc")]) is None  # all or none
    assert any("broken.yaml" in r.getMessage() for r in caplog.records)

    # nvidia-ctk regenerates the spec (e.g. after a driver upgrade): picked up on the next call
    path = tmp_path / "a" / "nvidia.json"
    path.write_text(json.dumps(_spec([("GPU-ccc", ["/dev/nvidia2"])])))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert registry.gpu_names([(2, "GPU-ccc")]) == ["nvidia.com/gpu=GPU-ccc"]
    assert registry.gpu_names([(1, "GPU-bbb")]) is None
