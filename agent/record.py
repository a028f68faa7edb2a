"""`topoalloc agent record-fixture DIR`: record a machine in the fixture format.

NVML: every fact the agent asks for, through the given module (`pynvml` on a node), written as
nvml.json; a call that fails is recorded as its error, so the replay fails the same way.
sysfs: discovery runs once against the live root through a recording reader, and exactly the
paths it touched are copied, symlinks kept as symlinks (bus/pci/devices, class/*, driver, physfn,
virtfnN), so the copy reads back to the same topology.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pynvml

from agent import gpus as nv
from agent.nvml_replay import FORMAT_VERSION, REMOTE_TYPES
from agent.sysfs import Sysfs
from agent.topology import build_topology

_REMOTE_NAMES = {v: k for k, v in REMOTE_TYPES.items()}


def _error_name(exc: pynvml.NVMLError) -> str:
    code = getattr(exc, "value", None)
    for name in dir(pynvml):
        if name.startswith("NVML_ERROR_") and getattr(pynvml, name) == code:
            return name.removeprefix("NVML_ERROR_")
    return "UNKNOWN"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class RecordingSysfs(Sysfs):
    """A Sysfs reader that remembers every path it touched."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__(root)
        self.touched: set[str] = set()
        self.listed: dict[str, list[str]] = {}

    def read(self, rel: str | Path) -> str | None:
        self.touched.add(str(rel))
        return super().read(rel)

    def listdir(self, rel: str | Path) -> list[str]:
        names = super().listdir(rel)
        self.listed[str(rel)] = names
        return names

    def resolve(self, rel: str | Path) -> Path | None:
        self.touched.add(str(rel))
        return super().resolve(rel)

    def exists(self, rel: str | Path) -> bool:
        self.touched.add(str(rel))
        return super().exists(rel)

    def link_name(self, rel: str | Path) -> str:
        self.touched.add(str(rel))
        return super().link_name(rel)


class _Copier:
    def __init__(self, src: Path, dst: Path) -> None:
        self.src, self.dst = src, dst
        self.files = 0
        self.links = 0
        self.empty: list[str] = []  # directories with nothing git can store

    def copy(self, rel: str, *, entry_only: bool = False) -> None:
        """Copy `rel` (following and re-creating symlinks on the way); `entry_only` creates a
        directory entry without its contents."""
        parts = Path(os.path.normpath(rel)).parts
        if not parts or parts[0] == "..":
            return
        for i in range(len(parts)):
            prefix = Path(*parts[: i + 1])
            s, d = self.src / prefix, self.dst / prefix
            if s.is_symlink():
                target = os.readlink(s)
                if not d.is_symlink():
                    d.parent.mkdir(parents=True, exist_ok=True)
                    os.symlink(target, d)
                    self.links += 1
                resolved = os.path.normpath(prefix.parent / target)
                rest = parts[i + 1 :]
                if resolved.startswith(".."):
                    return  # leads outside the root: keep the link, nothing more to copy
                if rest or not entry_only:
                    self.copy(str(Path(resolved, *rest)), entry_only=entry_only)
                return
            if not s.exists():
                return
            if s.is_dir():
                d.mkdir(parents=True, exist_ok=True)
                continue
            if i == len(parts) - 1 and not d.exists():
                d.parent.mkdir(parents=True, exist_ok=True)
                try:
                    d.write_bytes(s.read_bytes())
                except OSError:
                    return  # unreadable on the source: the agent saw it unreadable too
                self.files += 1

    def fill_empty_dirs(self) -> list[str]:
        """Git stores no empty directory, and a live sysfs has none where the agent looks: a
        directory the agent only names or links into (a driver, a netdev) gets its links that
        lead back into the copy (the driver's bound devices, the netdev's `device`). Returns the
        directories that stay empty, which a clone of the recording would lose."""
        empty = []
        for dirpath, dirnames, filenames in os.walk(self.dst, topdown=False):
            here = Path(dirpath)
            if dirnames or filenames:
                continue
            rel = here.relative_to(self.dst)
            src_dir = self.src / rel
            names = sorted(os.listdir(src_dir)) if src_dir.is_dir() and not src_dir.is_symlink() else []
            for name in names:
                if not (src_dir / name).is_symlink():
                    continue
                target = os.readlink(src_dir / name)
                inside = os.path.normpath(rel / target)
                leads_in = not os.path.isabs(target) and not inside.startswith("..")
                if leads_in and os.path.lexists(self.dst / inside):
                    os.symlink(target, here / name)
                    self.links += 1
            if not any(here.iterdir()):
                empty.append(str(rel))
        return empty


def record_nvml(nvml: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"format": FORMAT_VERSION}
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as exc:
        out["initError"] = _error_name(exc)
        out["devices"] = []
        return out
    try:
        for key, call in (
            ("driverVersion", lambda: _text(nvml.nvmlSystemGetDriverVersion())),
            ("cudaDriverVersion", lambda: int(nvml.nvmlSystemGetCudaDriverVersion())),
        ):
            with contextlib.suppress(pynvml.NVMLError):
                out[key] = call()
        count = int(nvml.nvmlDeviceGetCount())
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        bus_ids = []
        for h in handles:
            try:
                bus_ids.append(_text(nvml.nvmlDeviceGetPciInfo(h).busId))
            except pynvml.NVMLError:
                bus_ids.append("")
        out["devices"] = [_record_gpu(nvml, i, h, handles, bus_ids) for i, h in enumerate(handles)]
    finally:
        nvml.nvmlShutdown()
    return out


def _record_gpu(nvml: Any, index: int, handle: Any, handles: list[Any], bus_ids: list[str]) -> dict[str, Any]:
    dev: dict[str, Any] = {"index": index}
    errors: dict[str, str] = {}

    def grab(key: str, function: str, convert: Any) -> None:
        try:
            dev[key] = convert(getattr(nvml, function)(handle))
        except pynvml.NVMLError_NotSupported:
            pass  # an absent field replays as NOT_SUPPORTED
        except pynvml.NVMLError as exc:
            errors[function] = _error_name(exc)

    grab("uuid", "nvmlDeviceGetUUID", _text)
    grab("minor", "nvmlDeviceGetMinorNumber", int)
    grab("name", "nvmlDeviceGetName", _text)
    grab("pciBusId", "nvmlDeviceGetPciInfo", lambda p: _text(p.busId))
    grab("memoryTotal", "nvmlDeviceGetMemoryInfo", lambda m: int(m.total))
    grab("memoryUsed", "nvmlDeviceGetMemoryInfo", lambda m: int(m.used))
    grab(
        "utilization", "nvmlDeviceGetUtilizationRates", lambda u: {"gpu": int(u.gpu), "memory": int(u.memory)}
    )
    grab("numaNode", "nvmlDeviceGetNumaNodeId", int)
    grab("moduleId", "nvmlDeviceGetModuleId", int)
    grab("supportedEvents", "nvmlDeviceGetSupportedEventTypes", int)
    with contextlib.suppress(pynvml.NVMLError):
        dev["pcie"] = {
            "gen": int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
            "width": int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
        }
    links: list[dict[str, Any]] = []
    version = 0
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            state = int(nvml.nvmlDeviceGetNvLinkState(handle, link))
        except (pynvml.NVMLError_InvalidArgument, pynvml.NVMLError_NotSupported):
            break
        entry: dict[str, Any] = {"state": state}
        if state:
            try:
                entry["remotePciBusId"] = _text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
                entry["remoteType"] = _REMOTE_NAMES.get(
                    nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link), "unknown"
                )
                version = version or int(nvml.nvmlDeviceGetNvLinkVersion(handle, link))
            except pynvml.NVMLError:
                pass
        links.append(entry)
    if links:
        dev["nvlink"] = {"version": version, "links": links}
    topology = {}
    for other, bus in zip(handles, bus_ids, strict=True):
        if other is handle or not bus:
            continue
        with contextlib.suppress(pynvml.NVMLError):
            topology[bus] = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handle, other))
    if topology:
        dev["topology"] = topology
    if errors:
        dev["errors"] = errors
    return dev


def copy_sysfs(nvml_data: dict[str, Any], src: str | Path, dst: str | Path) -> _Copier:
    """Copy from `src` exactly the sysfs paths discovery touches for the GPUs in `nvml_data`."""
    from agent.nvml_replay import NvmlReplay

    replay = NvmlReplay(nvml_data)
    gpus = []
    if nv.init(replay) == "":
        gpus = [nv.gpu_facts(replay, i) for i in range(len(nvml_data.get("devices") or []))]
    reader = RecordingSysfs(src)
    build_topology(gpus, reader)
    copier = _Copier(Path(src), Path(dst))
    Path(dst).mkdir(parents=True, exist_ok=True)
    for rel in sorted(reader.touched):
        copier.copy(rel)
    for rel, names in sorted(reader.listed.items()):
        copier.copy(rel)
        for name in names:
            copier.copy(str(Path(rel) / name), entry_only=True)
    copier.empty = copier.fill_empty_dirs()
    return copier


def record(nvml: Any, sysfs_root: str | Path, directory: str | Path, *, machine: str = "") -> str:
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = record_nvml(nvml)
    data["source"] = machine or "recorded with topoalloc agent record-fixture"
    with open(out_dir / "nvml.json", "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")

    copier = copy_sysfs(data, sysfs_root, out_dir / "sys")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    readme = out_dir / "README.md"
    if not readme.exists():
        readme.write_text(
            f"# {machine or 'Recorded machine'}\n\nRecorded on {stamp} with `topoalloc agent record-fixture` "
            "(NVML through pynvml, the sysfs files the agent reads). Say here which machine this is.\n",
            encoding="utf-8",
        )
    message = (
        f"recorded {len(data.get('devices') or [])} GPU(s), {copier.files} sysfs files and "
        f"{copier.links} links into {out_dir}"
    )
    if copier.empty:
        lost = ", ".join(copier.empty[:5])
        message += f"; {len(copier.empty)} empty directories a git clone will lose: {lost}"
    return message
