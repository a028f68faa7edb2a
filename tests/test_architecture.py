"""Imports run one way: apis <- agent; apis <- allocator.core <- allocator.service / gang / simulator.

Inside the agent: discovery <- publish <- main_loop, midtier <- main_loop, and the runtime never
imports the fixture tooling (agent/fixtures), which may use the runtime."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# package -> top-level packages (or sub-packages) it must never import
FORBIDDEN = {
    "apis": ("agent", "allocator", "simulator", "topoalloc"),
    "agent": ("allocator", "simulator", "topoalloc"),
    # Discovery reads the machine and never talks to the cluster; publishing builds on discovery;
    # mid-tier only needs the pods. main_loop (and the CLI in topoalloc/commands) wires them.
    "agent/discovery": (
        "agent.publish",
        "agent.midtier",
        "agent.main_loop",
        "agent.healthz",
        "agent.kube",
        "kubernetes",
        "agent.fixtures",
        "agent.deviceplugin",
    ),
    "agent/publish": (
        "agent.midtier",
        "agent.main_loop",
        "agent.healthz",
        "agent.fixtures",
        "agent.deviceplugin",
    ),
    "agent/midtier": (
        "agent.discovery",
        "agent.publish",
        "agent.main_loop",
        "agent.healthz",
        "agent.fixtures",
        "agent.deviceplugin",
    ),
    # The device plugins take the Device the main loop built and the health book / mid-tier it owns
    # (for the checkpoint); they never drive discovery or publishing. Discovery, publishing and
    # mid-tier know nothing of them (main_loop names them only for type checking).
    "agent/deviceplugin": ("agent.main_loop", "agent.healthz", "agent.publish", "agent.fixtures"),
    "allocator/core": ("agent", "allocator.service", "allocator.gang", "simulator", "kubernetes", "aiohttp"),
    "allocator/service": ("agent", "simulator"),
    # Gang scheduling builds on the service's parts (cache, API client, events) and is wired in by
    # the service's server; it never reaches for the wiring itself.
    "allocator/gang": (
        "agent",
        "simulator",
        "allocator.service.server",
        "allocator.service.app",
        "allocator.service.handlers",
        "allocator.service.cli",
    ),
    "simulator": ("agent", "allocator.service", "allocator.gang", "kubernetes", "aiohttp"),
}
# The pure core does no I/O.
CORE_IO_MODULES = ("socket", "subprocess", "requests", "urllib", "http", "asyncio", "threading")


# The agent's runtime is agent/ without this folder. The runtime takes its NVML module as an argument
# (`pynvml` on a node), so even the NVML replay is a tool: only `topoalloc agent --fixture`
# (topoalloc/commands/agent.py) loads a fixture and hands its replay to the runtime.
AGENT_TOOLS = "agent/fixtures"


def _imports(path: Path, *, submodules: bool = False) -> set[str]:
    """Absolute imports of a file; with `submodules`, `from a.b import c` also counts as `a.b.c`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            if submodules:
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _violations(package: str, forbidden: tuple[str, ...], *, submodules: bool = False) -> list[str]:
    root = REPO / package
    out = []
    for path in sorted(root.rglob("*.py")):
        if package == "allocator/core" and path.name == "cli.py":
            continue  # the CLI is the core's edge: it reads files
        for name in _imports(path, submodules=submodules):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                out.append(f"{path.relative_to(REPO)} imports {name}")
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_run_one_way(package: str) -> None:
    # In the agent, `from agent import fixtures` or `from agent.publish import publisher` count too.
    assert _violations(package, FORBIDDEN[package], submodules=package.startswith("agent")) == []


def test_core_does_no_io() -> None:
    assert _violations("allocator/core", CORE_IO_MODULES) == []


def test_agent_runtime_does_not_import_fixture_tools() -> None:
    found = _violations("agent", ("agent.fixtures",), submodules=True)
    assert [v for v in found if not v.startswith(AGENT_TOOLS + "/")] == []
