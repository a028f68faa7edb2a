"""Imports run one way: apis <- agent; apis <- allocator.core <- allocator.service <- allocator.gang;
allocator.core <- simulator; allocator.assembly wires service and gang."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# package -> top-level packages (or sub-packages) it must never import
FORBIDDEN = {
    "apis": ("agent", "allocator", "simulator", "topoalloc"),
    "agent": ("allocator", "simulator"),
    "allocator/core": ("agent", "allocator.service", "allocator.gang", "simulator", "kubernetes", "aiohttp"),
    # The service defines the gang seam (allocator/service/gang_hooks.py) and never imports the
    # gang package; allocator/assembly.py is the one module that imports both.
    "allocator/service": ("agent", "simulator", "allocator.gang", "allocator.assembly", "topoalloc"),
    # Gang scheduling builds on the service's parts (cache, API client, events, TLS, settings) and
    # is plugged in by allocator/assembly.py; it never reaches for the wiring itself.
    "allocator/gang": (
        "agent",
        "simulator",
        "allocator.assembly",
        "allocator.service.server",
        "allocator.service.app",
        "allocator.service.handlers",
        "topoalloc",
    ),
    "simulator": ("agent", "allocator.service", "allocator.gang", "kubernetes", "aiohttp"),
}
# The pure core does no I/O.
CORE_IO_MODULES = ("socket", "subprocess", "requests", "urllib", "http", "asyncio", "threading")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    root = REPO / package
    out = []
    for path in sorted(root.rglob("*.py")):
        if package == "allocator/core" and path.name == "cli.py":
            continue  # the CLI is the core's edge: it reads files
        for name in _imports(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                out.append(f"{path.relative_to(REPO)} imports {name}")
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_run_one_way(package: str) -> None:
    assert _violations(package, FORBIDDEN[package]) == []


def test_core_does_no_io() -> None:
    assert _violations("allocator/core", CORE_IO_MODULES) == []
