"""A hardware fixture folder: `nvml.json` (replayed NVML) and `sys/` (a sysfs root)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.nvml_replay import NvmlReplay

NVML_FILE = "nvml.json"
SYS_DIR = "sys"


class FixtureError(ValueError):
    pass


@dataclass
class Fixture:
    root: Path
    nvml: NvmlReplay
    sys_root: Path

    @classmethod
    def load(cls, folder: str | Path) -> Fixture:
        root = Path(folder)
        if not (root / SYS_DIR).is_dir():
            raise FixtureError(f"{root}: no {SYS_DIR}/ folder (not a hardware fixture)")
        if not (root / NVML_FILE).is_file():
            raise FixtureError(f"{root}: no {NVML_FILE}")
        try:
            nvml = NvmlReplay.load(root / NVML_FILE)
        except (OSError, ValueError) as exc:
            raise FixtureError(f"{root / NVML_FILE}: {exc}") from None
        return cls(root, nvml, root / SYS_DIR)
