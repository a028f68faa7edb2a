"""Imports run one way: apis <- agent; apis <- allocator.core <- allocator.service <- allocator.gang;
allocator.core <- simulator; allocator/assembly.py is the one module that imports both the service
and the gang package (the service defines the seam, `GangHooks`, and never imports allocator.gang).

Inside the core, sub-packages form layers (`CORE_LAYERS`, lowest first): a module imports only
from its own layer or lower ones. The core does no I/O. allocator/ has no import cycle (type-only
imports count: they break the day someone needs the name at run time) and no module over
`MAX_LINES` lines.

Inside the agent: discovery <- publish <- main_loop, midtier <- main_loop, and the runtime never
imports the fixture tooling (agent/fixtures), which may use the runtime.
"""

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
        "agent.dra",
    ),
    "agent/publish": (
        "agent.midtier",
        "agent.main_loop",
        "agent.healthz",
        "agent.fixtures",
        "agent.deviceplugin",
        "agent.dra",
    ),
    "agent/midtier": (
        "agent.discovery",
        "agent.publish",
        "agent.main_loop",
        "agent.healthz",
        "agent.fixtures",
        "agent.deviceplugin",
        "agent.dra",
    ),
    # The device plugins take the Device the main loop built and the health book / mid-tier it owns
    # (for the checkpoint); they never drive discovery or publishing. Discovery, publishing and
    # mid-tier know nothing of them (main_loop names them only for type checking).
    "agent/deviceplugin": (
        "agent.main_loop",
        "agent.healthz",
        "agent.publish",
        "agent.fixtures",
        "agent.dra",
    ),
    # dra mode likewise: its slices and its kubelet plugin are built from the Device the main loop
    # built; the two kubelet plugins share only agent/{checkpoint,unix_grpc,container_devices}.py.
    "agent/dra": (
        "agent.main_loop",
        "agent.healthz",
        "agent.publish",
        "agent.fixtures",
        "agent.deviceplugin",
    ),
    "allocator/core": (
        "agent",
        "allocator.service",
        "allocator.gang",
        "allocator.assembly",
        "simulator",
        "topoalloc",
    ),
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
    "simulator": ("agent", "allocator.service", "allocator.gang", "topoalloc", "kubernetes", "aiohttp"),
}
# The pure core does no I/O: no files formats, no command line, no processes, sockets, threads or
# event loops, no Kubernetes client. (open() and pathlib reads are not caught here.)
CORE_IO_MODULES = (
    "yaml",
    "click",
    "os",
    "socket",
    "subprocess",
    "requests",
    "urllib",
    "http",
    "asyncio",
    "threading",
    "kubernetes",
    "aiohttp",
)
# allocator.core's sub-packages, lowest first (`reasons` is a module at the core's root).
CORE_LAYERS = ("reasons", "request", "node", "scoring", "devices", "cluster", "gang")

MAX_LINES = 500
# Modules allowed over MAX_LINES (none: a module that grows past it is split by concern).
OVERSIZED_FOR_NOW: set[str] = set()
# Import cycles allowed in allocator/ (none).
KNOWN_CYCLES: set[tuple[str, ...]] = set()


# The agent's runtime is agent/ without this folder. The runtime takes its NVML module as an argument
# (`pynvml` on a node), so even the NVML replay is a tool: only `topoalloc agent --fixture`
# (topoalloc/commands/agent.py) loads a fixture and hands its replay to the runtime.
AGENT_TOOLS = "agent/fixtures"


def _imports(path: Path) -> set[str]:
    """Every absolute module named by an import anywhere in the file (TYPE_CHECKING blocks and
    function bodies included); `from a import b` names both `a` and `a.b`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    root = REPO / package
    out = []
    for path in sorted(root.rglob("*.py")):
        for name in sorted(_imports(path)):
            if any(_matches(name, f) for f in forbidden):
                out.append(f"{path.relative_to(REPO)} imports {name}")
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_run_one_way(package: str) -> None:
    assert _violations(package, FORBIDDEN[package]) == []


def test_core_does_no_io() -> None:
    assert _violations("allocator/core", CORE_IO_MODULES) == []


def test_agent_runtime_does_not_import_fixture_tools() -> None:
    found = _violations("agent", ("agent.fixtures",))
    assert [v for v in found if not v.startswith(AGENT_TOOLS + "/")] == []


def _core_layer(module: str) -> int | None:
    """The layer index of an allocator.core module (None: not in the core or the core's root)."""
    parts = module.split(".")
    if parts[:2] != ["allocator", "core"] or len(parts) < 3:
        return None
    return CORE_LAYERS.index(parts[2]) if parts[2] in CORE_LAYERS else None


def test_core_layers_import_only_downwards() -> None:
    core = REPO / "allocator" / "core"
    unplaced = sorted(
        str(p.relative_to(REPO))
        for p in core.iterdir()
        if p.name != "__init__.py" and p.name != "__pycache__" and p.stem not in CORE_LAYERS
    )
    assert unplaced == [], "every core module or sub-package belongs to a layer in CORE_LAYERS"
    upward = []
    for path in sorted(core.rglob("*.py")):
        mine = _core_layer(_module_name(path))
        if mine is None:
            continue
        for name in sorted(_imports(path)):
            theirs = _core_layer(name)
            if theirs is not None and theirs > mine:
                upward.append(f"{path.relative_to(REPO)} ({CORE_LAYERS[mine]}) imports {name}")
    assert upward == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_graph(package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports (the most specific module a name resolves
    to, plus the packages above it, whose __init__ runs first, except the importer's own)."""
    paths = {_module_name(p): p for p in (REPO / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        own = {module.rsplit(".", i)[0] for i in range(module.count(".") + 1)}
        edges: set[str] = set()
        for name in _imports(path):
            while name and name not in paths:
                name = name.rpartition(".")[0]
            parts = name.split(".") if name else []
            edges.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        graph[module] = {e for e in edges if e in paths and e not in own}
    return graph


def _cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(tuple(sorted(component)))
    return found


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == {("a", "b", "c")}
    assert _cycles({"a": {"b"}, "b": set()}) == set()


def test_no_import_cycles_in_allocator() -> None:
    assert _cycles(_import_graph("allocator")) == KNOWN_CYCLES


def test_no_module_over_the_size_limit() -> None:
    sizes = {
        str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in (REPO / "allocator").rglob("*.py")
    }
    oversized = {path for path, lines in sizes.items() if lines > MAX_LINES}
    assert oversized == OVERSIZED_FOR_NOW, {p: sizes.get(p) for p in oversized ^ OVERSIZED_FOR_NOW}
