"""Hot-plug through the real udev path: a VF added in the fixture tree, announced by a uevent from a
umockdev testbed, reaches the running agent's pyudev monitor and appears in the Device CR on the
fake API server within 2 s. The agent resyncs only every 60 s here, and a VF added without a
uevent stays unseen, so nothing but the udev path can explain the update."""

from __future__ import annotations

import ctypes.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.agent.support import FIXTURES, REPO

NODE = "hotplug-node"
pytestmark = pytest.mark.umockdev


def _umockdev_missing() -> str:
    if shutil.which("umockdev-wrapper") is None:
        return "umockdev-wrapper not installed (apt-get install umockdev gir1.2-umockdev-1.0)"
    if ctypes.util.find_library("umockdev") is None:
        return "libumockdev.so.0 not installed"
    return ""


def _vfs(server, ibdev: str) -> list[str]:
    dev = server.get("devices", NODE)
    if dev is None:
        return []
    nic = next(d for d in dev["spec"]["devices"] if d.get("labels", {}).get("ibdev") == ibdev)
    return [vf["busID"] for g in nic.get("vfGroups", []) for vf in g["vfs"]]


def _wait_for(predicate, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.time()
        time.sleep(0.02)
    return None


@pytest.mark.skipif(bool(_umockdev_missing()), reason=_umockdev_missing() or "umockdev present")
def test_vf_added_through_udev_appears_in_the_device_within_2s(fake_api_thread, tmp_path: Path) -> None:
    server = fake_api_thread
    server.put(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE},
            "status": {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}},
        }
    )
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
                "users": [{"name": "fake", "user": {}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            }
        )
    )
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"midTier": {"enabled": False}, "udevSource": "udev"}))
    agent_argv = [
        sys.executable,
        "-m",
        "topoalloc",
        "agent",
        "--node-name",
        NODE,
        "--kubeconfig",
        str(kubeconfig),
        "--config",
        str(config),
        "--resync",
        "60",
        "--health-port",
        "0",
        "--metrics-address",
        "127.0.0.1",
        "--metrics-port",
        "0",
        "-v",
    ]
    bed = subprocess.Popen(
        [
            "umockdev-wrapper",
            sys.executable,
            str(Path(__file__).parent / "udev_bed.py"),
            str(FIXTURES / "dgx-h100"),
            "--",
            *agent_argv,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert bed.stdout is not None and bed.stdin is not None
        ready = bed.stdout.readline()
        assert ready.startswith("READY"), ready
        assert _wait_for(lambda: len(_vfs(server, "mlx5_0")) == 4, 20), "the agent never published"

        # control: the tree changes but no uevent is sent -> not seen (next resync is 60 s away)
        bed.stdin.write("add-vf-silent 0000:40:00.0 0000:40:00.5\n")
        bed.stdin.flush()
        assert bed.stdout.readline().startswith("SENT")
        assert _wait_for(lambda: "0000:40:00.5" in _vfs(server, "mlx5_3"), 2.5) is None

        # the same change announced by udev -> published within 2 s
        bed.stdin.write("add-vf 0000:18:00.0 0000:18:00.5\n")
        bed.stdin.flush()
        sent = float(bed.stdout.readline().split()[1])
        seen = _wait_for(lambda: "0000:18:00.5" in _vfs(server, "mlx5_0"), 5)
        assert seen is not None, "the VF never appeared"
        print(f"uevent -> Device CR: {seen - sent:.3f} s")
        assert seen - sent <= 2.0, f"took {seen - sent:.2f} s"
        # the pass the uevent triggered also picked up the silent VF: both are now there
        assert "0000:40:00.5" in _vfs(server, "mlx5_3")
        bed.stdin.write("quit\n")
        bed.stdin.flush()
        assert bed.wait(20) == 0
    finally:
        if bed.poll() is None:
            bed.kill()
            bed.wait(5)
