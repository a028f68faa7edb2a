"""What a hw-fixture's own recordings say about its devices, read straight from its NVML dump and its
sysfs tree (not through the agent): for tests that check what a container was handed against the
machine's facts rather than against the product's own output. No pytest here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tests.support.controlplane import REPO


@dataclass(frozen=True)
class NvmlGpu:
    minor: int
    uuid: str
    bdf: str  # PCI address as sysfs writes it: 0000:1b:00.0
    memory: int  # bytes


@dataclass(frozen=True)
class FixtureFacts:
    root: Path

    @property
    def gpus(self) -> dict[int, NvmlGpu]:
        return _gpus(self.root)

    def _function(self, bdf: str) -> Path:
        found = _functions(self.root).get(bdf)
        assert found is not None, f"{self.root.name}: no PCI function {bdf} in its sysfs"
        return found

    def switch(self, bdf: str) -> str:
        """The PCIe switch a function sits behind: the bridge just below its root port (its
        upstream port), or "" when the function hangs off the root port itself."""
        parts = self._function(bdf).relative_to(self.root / "sys" / "devices").parts
        return parts[2] if len(parts) > 3 else ""

    def physfn(self, vf: str) -> str:
        """The physical function an SR-IOV VF belongs to (its `physfn` link)."""
        return (self._function(vf) / "physfn").resolve().name

    def uverbs(self, function: str) -> list[str]:
        """The RDMA verbs devices of a function (`uverbsN` under its `infiniband_verbs`)."""
        verbs = self._function(function) / "infiniband_verbs"
        return sorted(p.name for p in verbs.iterdir()) if verbs.is_dir() else []


def fixture_facts(name: str) -> FixtureFacts:
    return FixtureFacts(REPO / "hw-fixtures" / name)


@cache
def _gpus(root: Path) -> dict[int, NvmlGpu]:
    nvml = json.loads((root / "nvml.json").read_text())
    return {
        int(d["minor"]): NvmlGpu(
            int(d["minor"]), d["uuid"], d["pciBusId"][-12:].lower(), int(d["memoryTotal"])
        )
        for d in nvml["devices"]
    }


@cache
def _functions(root: Path) -> dict[str, Path]:
    """Every PCI function of the sysfs tree by address, at its place in the hierarchy."""
    devices = root / "sys" / "devices"
    return {p.name: p for p in devices.rglob("0000:*") if p.is_dir() and not p.is_symlink()}
