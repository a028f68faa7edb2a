"""Recording a machine keeps exactly what discovery reads, in a form git stores: a live sysfs has
many more attributes than the fixture, and none of them may leak into the recording as a copied
file or an empty directory."""

from __future__ import annotations

import os
from pathlib import Path

from agent.fixtures.loader import Fixture
from agent.fixtures.recorder import record
from agent.publish.device_builder import device_object
from tests.agent.support import FIXTURES, copy_fixture, one_pass

PF = "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _empty_dirs(root: Path) -> list[str]:
    return [d for d, dirs, files in os.walk(root) if not dirs and not files]


def _add_live_attributes(sys_root: Path) -> None:
    """What a kernel has next to the files discovery reads: PF attributes and subdirectories, a
    netdev's own attributes, the driver's control files and its module link (outside the tree)."""
    pf = sys_root / PF
    (pf / "config").write_bytes(b"\xb3\x15\x1d\x10")
    for sub, attr in (("power", "control"), ("msi_irqs", "41"), ("ptp/ptp0", "clock_name")):
        (pf / sub).mkdir(parents=True)
        (pf / sub / attr).write_text("x\n")
    (pf / "iommu_group").symlink_to("../../../../../../kernel/iommu_groups/12")
    netdev = pf / "net/ibp24s0"
    (netdev / "operstate").write_text("up\n")
    (netdev / "queues").mkdir()
    (netdev / "subsystem").symlink_to("../../../../../../../../class/net")
    driver = sys_root / "bus/pci/drivers/mlx5_core"
    for name in ("bind", "unbind", "new_id", "remove_id", "uevent"):
        (driver / name).write_text("")
    (driver / "module").symlink_to("../../../../module/mlx5_core")


def test_a_recording_of_a_live_like_tree_holds_only_what_discovery_reads(tmp_path: Path) -> None:
    live = copy_fixture("dgx-h100", tmp_path / "live")
    _add_live_attributes(live / "sys")
    out = tmp_path / "recorded"

    message = record(Fixture.load(live).nvml, live / "sys", out, machine="live-like dgx")

    assert "empty directories" not in message
    assert _empty_dirs(out / "sys") == []
    # exactly the committed fixture: no extra attribute, directory or link came along ...
    assert _files(out / "sys") == _files(FIXTURES / "dgx-h100/sys")
    # ... and it reads back to the same Device
    assert device_object(one_pass(out).device) == device_object(one_pass(FIXTURES / "dgx-h100").device)


def test_a_directory_that_cannot_be_kept_is_reported(tmp_path: Path) -> None:
    """A netdev directory with no link back into the recording would be lost by git; the
    recorder says so instead of leaving a fixture that changes when cloned."""
    live = copy_fixture("dgx-h100", tmp_path / "live")
    (live / "sys" / PF / "net/ibp24s0/device").unlink()
    out = tmp_path / "recorded"

    message = record(Fixture.load(live).nvml, live / "sys", out)

    assert "1 empty directories a git clone will lose" in message
    assert f"{PF}/net/ibp24s0" in message
