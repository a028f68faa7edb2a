"""A umockdev testbed around a running agent, for the hot-plug test (run under `umockdev-wrapper`).

    umockdev-wrapper python tests/agent/udev_bed.py FIXTURE -- topoalloc agent ...args

It creates a umockdev testbed (libumockdev through ctypes: no PyGObject needed, so it runs in the
project's own interpreter), copies the fixture into the testbed directory (sys/ and nvml.json), and
starts the agent with `--fixture <testbed dir>` in the same preloaded environment: the agent's
pyudev monitor binds its uevent netlink socket, which umockdev's preload turns into a socket in
the testbed directory. Commands on stdin then change the tree the way the kernel would and emit the
uevent through `umockdev_testbed_uevent`, i.e. the real libudev monitor path:

    add-vf PF VF         create VF under PF (virtfnN, physfn, bus/pci link, sriov_numvfs), send "add"
    add-vf-silent PF VF  the same change without a uevent (a control: only the resync would see it)
    quit

Replies on stdout: "READY <dir>" once the agent's monitor socket exists, "SENT <epoch>" per event.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL("libumockdev.so.0")
    lib.umockdev_testbed_new.restype = ctypes.c_void_p
    lib.umockdev_testbed_get_root_dir.restype = ctypes.c_char_p
    lib.umockdev_testbed_get_root_dir.argtypes = [ctypes.c_void_p]
    lib.umockdev_testbed_uevent.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    lib.umockdev_testbed_uevent.restype = None
    return lib


def _link(path: Path, target: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, path.parent), path)


def add_vf(sys_root: Path, pf: str, vf: str) -> Path:
    """Create VF `vf` of `pf` as the kernel does when sriov_numvfs grows; return its device dir."""
    pf_dir = (sys_root / "bus/pci/devices" / pf).resolve()
    vf_dir = pf_dir.parent / vf
    vf_dir.mkdir()
    (vf_dir / "numa_node").write_text((pf_dir / "numa_node").read_text())
    (vf_dir / "uevent").write_text(f"PCI_SLOT_NAME={vf}\nDRIVER=mlx5_core\n")
    _link(vf_dir / "subsystem", sys_root / "bus/pci")
    _link(vf_dir / "physfn", pf_dir)
    _link(sys_root / "bus/pci/devices" / vf, vf_dir)
    n = len([p for p in pf_dir.iterdir() if p.name.startswith("virtfn")])
    _link(pf_dir / f"virtfn{n}", vf_dir)
    (pf_dir / "sriov_numvfs").write_text(f"{n + 1}\n")
    return vf_dir


def main() -> int:
    args = sys.argv[1:]
    split = args.index("--")
    fixture, agent_argv = Path(args[0]), args[split + 1 :]
    lib = _lib()
    bed = lib.umockdev_testbed_new()
    root = Path(lib.umockdev_testbed_get_root_dir(bed).decode())
    shutil.copytree(fixture / "sys", root / "sys", symlinks=True, dirs_exist_ok=True)
    shutil.copy(fixture / "nvml.json", root / "nvml.json")
    env = dict(os.environ, UMOCKDEV_DIR=str(root))  # the C library set it; os.environ is a snapshot
    agent = subprocess.Popen([*agent_argv, "--fixture", str(root)], env=env)
    try:
        deadline = time.monotonic() + 30
        while not any(p.name.startswith("event") for p in root.iterdir()):
            if agent.poll() is not None or time.monotonic() > deadline:
                print(f"FAILED agent exited={agent.poll()} or its udev monitor never bound", flush=True)
                return 1
            time.sleep(0.02)
        print(f"READY {root}", flush=True)
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "quit":
                break
            if words[0] in ("add-vf", "add-vf-silent"):
                vf_dir = add_vf(root / "sys", words[1], words[2])
                if words[0] == "add-vf":
                    devpath = "/" + str(vf_dir.relative_to(root))
                    lib.umockdev_testbed_uevent(bed, devpath.encode(), b"add")
                print(f"SENT {time.time():.6f}", flush=True)
    finally:
        agent.terminate()
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
