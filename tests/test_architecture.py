"""Imports run one way: apis <- agent; apis <- allocator.core <- allocator.runtime <- the allocator's
components (`COMPONENTS`: allocator.extender, .gang, .reservations, .claims, .defrag, .scarce, side by
side, none importing another); allocator.core <- simulator; allocator/assembly.py is the one module
that imports several components. Only allocator/runtime/coreadapter.py reaches the core's cluster
state (`allocator.core.cluster`).

Inside the core, sub-packages form layers (`CORE_LAYERS`, lowest first): a module imports only
from its own layer or lower ones. The core does no I/O and reads no clock (the time comes in as an
argument).

Inside the agent: discovery <- publish <- main_loop, midtier <- main_loop, and the runtime never
imports the fixture tooling (agent/fixtures), which may use the runtime.

The whole tree: no import cycle among the modules of `TREE` (type-only and relative imports count:
a type-only cycle breaks the day someone needs the name at run time), no module anywhere over
`MAX_LINES` lines, the product never imports tests or benchmarks, and the test support never
imports a test area's modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The test areas (tests/<area>/ and tests/test_*.py): test modules and their own harnesses.
TEST_AREAS = tuple(
    sorted(
        f"tests.{p.stem}"
        for p in (REPO / "tests").iterdir()
        if p.name not in ("support", "__init__.py", "conftest.py") and (p.is_dir() or p.suffix == ".py")
        if not p.name.startswith((".", "__"))
    )
)

# The allocator's components, side by side on the runtime (allocator/<name>/): each imports apis,
# the pure core and allocator.runtime, and no other component; allocator/assembly.py, the wiring,
# alone imports several. The extender defines the seams (`GangHooks`, `ReservationHooks`) that gang
# scheduling and Reservations implement structurally; each component sees the watch cache through
# its own narrow view (allocator/<name>/cache_view.py, tests/runtime/test_cache_views.py), never the
# ClusterCache class. Every allocator package is a component or one of the layers below them.
COMPONENTS = ("claims", "defrag", "extender", "gang", "placement", "reservations", "scarce")
BELOW_THE_COMPONENTS = ("core", "runtime")
ABOVE_THE_COMPONENTS = ("agent", "simulator", "topoalloc", "allocator.assembly")
THROUGH_A_CACHE_VIEW = ("allocator.runtime.cache.store",)
# Narrower still: scarce-resource avoidance is one stateless admission route on the runtime's
# envelope; it needs no cache and no core.
OWN_LIMITS = {"scarce": ("allocator.core", "allocator.runtime.cache")}


def _components(*names: str) -> tuple[str, ...]:
    return tuple(f"allocator.{name}" for name in names)


def _component_rule(component: str) -> tuple[str, ...]:
    """What a component must never import: what sits above it, every other component, and the
    cache class (or what its own limits say)."""
    others = _components(*(c for c in COMPONENTS if c != component))
    return (*ABOVE_THE_COMPONENTS, *others, *OWN_LIMITS.get(component, THROUGH_A_CACHE_VIEW))


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
    # built; the two kubelet plugins share only agent/{checkpoint,unix_grpc,container_devices,events}.py.
    "agent/dra": (
        "agent.main_loop",
        "agent.healthz",
        "agent.publish",
        "agent.fixtures",
        "agent.deviceplugin",
    ),
    # What every test area shares (fake API server, control plane, kubelet, machines) builds on the
    # product only, never on one area's tests or harness. topoalloc/commands and bench/ sit on top of
    # everything and may import all of it (the commands lazily, see topoalloc/cli.py).
    "tests/support": TEST_AREAS,
    "allocator/core": ("allocator.runtime", *ABOVE_THE_COMPONENTS, *_components(*COMPONENTS)),
    # What every component on top shares (watch cache, hold ledger, API client, events, TLS, leader
    # election, metrics, config, the core adapter); it knows none of them.
    "allocator/runtime": (*ABOVE_THE_COMPONENTS, *_components(*COMPONENTS)),
    **{f"allocator/{c}": _component_rule(c) for c in COMPONENTS},
    "simulator": (
        "agent",
        "topoalloc",
        "allocator.runtime",
        "allocator.assembly",
        *_components(*COMPONENTS),
        "kubernetes",
        "aiohttp",
    ),
}
# The pure core does no I/O: no files formats, no command line, no processes, sockets, threads or
# event loops, no Kubernetes client; and no clocks: `now` is an argument. (open() and pathlib reads
# are not caught here.)
CORE_IO_MODULES = (
    "time",
    "datetime",
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
# apis.timestamps' formatters read the clock when given no moment.
CLOCK_READING_CALLS = ("format_time", "micro_time")
# allocator.core's sub-packages, lowest first (`reasons` and `actions`, the lifecycles' shared
# action vocabulary, are modules at the core's root).
# `claims` and `reservation` are the two top layers, side by side: each builds on the gang planner
# and everything below, and neither imports the other (CORE_SIBLINGS).
CORE_LAYERS = (
    "reasons", "actions", "request", "node", "scoring", "devices", "cluster", "gang", "claims",
    "reservation", "defrag", "placement",
)  # fmt: skip
CORE_SIBLINGS = (("claims", "reservation"),)

# The product: what users install and run. It never imports tests/ or bench/.
PRODUCT = ("agent", "apis", "allocator", "simulator", "topoalloc")
# The modules held to "no import cycle": the product, the benchmarks and the shared test support.
TREE = (*PRODUCT, "bench", "tests/support")

MAX_LINES = 500
# Modules allowed over MAX_LINES, anywhere in the tree (none: a module that grows past it is split
# by concern).
OVERSIZED_FOR_NOW: set[str] = set()
# Not held to MAX_LINES: generated gRPC stubs and the recorded machines (data, not code).
GENERATED = "_pb2"
NOT_CODE = ("hw-fixtures",)
# Import cycles allowed in TREE (none).
KNOWN_CYCLES: set[tuple[str, ...]] = set()


# The agent's runtime is agent/ without this folder. The runtime takes its NVML module as an argument
# (`pynvml` on a node), so even the NVML replay is a tool: only `topoalloc agent --fixture`
# (topoalloc/commands/agent.py) loads a fixture and hands its replay to the runtime.
AGENT_TOOLS = "agent/fixtures"


def _imports(path: Path, root: Path = REPO) -> set[str]:
    """Every module named by an import anywhere in the file (TYPE_CHECKING blocks and function
    bodies included), relative imports made absolute; `from a import b` names both `a` and `a.b`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parts = path.relative_to(root).with_suffix("").parts
    package = parts[:-1]  # what `from . import` means here, for a module and an __init__ alike
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join((*base, *([node.module] if node.module else [])))
            if not module:
                continue
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _violations(package: str, forbidden: tuple[str, ...], root: Path = REPO) -> list[str]:
    out = []
    for path in sorted((root / package).rglob("*.py")):
        for name in sorted(_imports(path, root)):
            if any(_matches(name, f) for f in forbidden):
                out.append(f"{path.relative_to(root)} imports {name}")
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_run_one_way(package: str) -> None:
    assert _violations(package, FORBIDDEN[package]) == []


# The one module that wires the components together (imports several).
WIRING = "allocator/assembly.py"


def _importing_several_components(root: Path = REPO) -> list[str]:
    found = []
    for package in (*PRODUCT, "bench"):  # where a module importing several could hide
        for path in sorted((root / package).rglob("*.py")):
            names = _imports(path, root)
            if sum(any(_matches(n, c) for n in names) for c in _components(*COMPONENTS)) > 1:
                found.append(str(path.relative_to(root)))
    return found


def test_only_the_wiring_imports_several_components() -> None:
    assert _importing_several_components() == [WIRING]


def test_every_allocator_package_is_a_component_or_below_them() -> None:
    packages = sorted(p.name for p in (REPO / "allocator").iterdir() if (p / "__init__.py").is_file())
    assert packages == sorted((*COMPONENTS, *BELOW_THE_COMPONENTS))


# Only the core adapter calls the core's cluster state (ClusterState and what takes it). Exempt: the
# core itself, the simulator (its model of the cluster is the core's ClusterState), and the two
# benchmarks that measure the core itself rather than the allocator (bench/core.py, bench/gang.py).
CORE_ADAPTER = "allocator/runtime/coreadapter.py"
THROUGH_THE_ADAPTER = ("allocator", "topoalloc", "bench")
CORE_BENCHMARKS = ("bench/core.py", "bench/gang.py")


def test_only_the_core_adapter_reaches_the_cluster_state() -> None:
    found = []
    for package in THROUGH_THE_ADAPTER:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if rel.startswith("allocator/core/") or rel == CORE_ADAPTER or rel in CORE_BENCHMARKS:
                continue
            if ".core.cluster" in path.read_text():
                found.append(f"{rel} mentions .core.cluster")
            found += [
                f"{rel} imports {n}" for n in sorted(_imports(path)) if _matches(n, "allocator.core.cluster")
            ]
    assert found == []


def _clock_reads(package: str, root: Path = REPO) -> list[str]:
    """Calls, by name, of a formatter that reads the clock when given no moment."""
    out = []
    for path in sorted((root / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call) and not node.args and not node.keywords:
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in CLOCK_READING_CALLS:
                    out.append(f"{path.relative_to(root)}:{node.lineno} calls {name}() (reads the clock)")
    return out


def test_core_does_no_io_and_reads_no_clock() -> None:
    assert _violations("allocator/core", CORE_IO_MODULES) == []
    assert _clock_reads("allocator/core") == []


def test_the_rules_catch_what_breaks_them(tmp_path: Path) -> None:
    """The checkers above, on a tree of modules written to break each rule."""
    broken = {
        "allocator/defrag/uses_scarce.py": "from allocator.scarce import webhook\n",
        "allocator/scarce/uses_defrag.py": "from ..defrag import planner\n",
        "allocator/reservations/uses_store.py": "from allocator.runtime.cache.store import ClusterCache\n",
        "allocator/core/gang/clocks.py": "import time\nfrom datetime import datetime\n",
        "allocator/core/gang/stamp.py": "from apis.timestamps import format_time\nNOW = format_time()\n",
        "topoalloc/wires.py": "import allocator.gang.steering\nfrom allocator.claims import controller\n",
    }
    for rel, text in broken.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert _violations("allocator/defrag", FORBIDDEN["allocator/defrag"], tmp_path) == [
        "allocator/defrag/uses_scarce.py imports allocator.scarce",
        "allocator/defrag/uses_scarce.py imports allocator.scarce.webhook",
    ]
    assert _violations("allocator/scarce", FORBIDDEN["allocator/scarce"], tmp_path) == [
        "allocator/scarce/uses_defrag.py imports allocator.defrag",
        "allocator/scarce/uses_defrag.py imports allocator.defrag.planner",
    ]
    assert _violations("allocator/reservations", FORBIDDEN["allocator/reservations"], tmp_path) == [
        "allocator/reservations/uses_store.py imports allocator.runtime.cache.store",
        "allocator/reservations/uses_store.py imports allocator.runtime.cache.store.ClusterCache",
    ]
    assert _violations("allocator/core", CORE_IO_MODULES, tmp_path) == [
        "allocator/core/gang/clocks.py imports datetime",
        "allocator/core/gang/clocks.py imports datetime.datetime",
        "allocator/core/gang/clocks.py imports time",
    ]
    assert _clock_reads("allocator/core", tmp_path) == [
        "allocator/core/gang/stamp.py:2 calls format_time() (reads the clock)"
    ]
    assert _importing_several_components(tmp_path) == ["topoalloc/wires.py"]
    # Every pair of components, both ways.
    for component in COMPONENTS:
        for other in _components(*COMPONENTS):
            assert _matches(other, f"allocator.{component}") or other in FORBIDDEN[f"allocator/{component}"]


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
            if theirs is None or theirs == mine:
                continue
            pair = (CORE_LAYERS[mine], CORE_LAYERS[theirs])
            if theirs > mine or pair in CORE_SIBLINGS or pair[::-1] in CORE_SIBLINGS:
                upward.append(f"{path.relative_to(REPO)} ({CORE_LAYERS[mine]}) imports {name}")
    assert upward == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_graph(*roots: str) -> dict[str, set[str]]:
    """module -> the modules under `roots` it imports (the most specific module a name resolves
    to, plus the packages above it, whose __init__ runs first, except the importer's own)."""
    paths = {_module_name(p): p for root in roots for p in (REPO / root).rglob("*.py")}
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


def test_relative_imports_are_made_absolute() -> None:
    fakeapi = REPO / "tests" / "support" / "fakeapi"
    # `from .reads import ListQuery` and `from . import errors` in a module; `from .errors import
    # ApiError` in a package's __init__, where "." is the package itself.
    assert {"tests.support.fakeapi.reads.ListQuery", "tests.support.fakeapi.errors"} <= _imports(
        fakeapi / "deletion.py"
    )
    assert "tests.support.fakeapi.errors.ApiError" in _imports(fakeapi / "__init__.py")


def test_no_import_cycles() -> None:
    assert _cycles(_import_graph(*TREE)) == KNOWN_CYCLES


def test_the_product_never_imports_tests_or_benchmarks() -> None:
    found = [v for package in PRODUCT for v in _violations(package, ("tests", "bench"))]
    assert found == []


def _code_modules() -> list[Path]:
    """Every .py file of the repository that people write: not the virtualenv or other hidden
    folders, not generated stubs, not the recorded machines."""
    return [
        p
        for p in REPO.rglob("*.py")
        if not any(part.startswith(".") or part in NOT_CODE for part in p.relative_to(REPO).parts)
        and GENERATED not in p.name
    ]


def test_no_module_over_the_size_limit() -> None:
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in _code_modules()}
    assert set(sizes) >= {"tests/test_architecture.py", "agent/main_loop.py", "bench/core.py"}
    oversized = {path for path, lines in sizes.items() if lines > MAX_LINES}
    assert oversized == OVERSIZED_FOR_NOW, {p: sizes.get(p) for p in oversized ^ OVERSIZED_FOR_NOW}


# API paths come from one table (apis/kinds.py) and writes from one client, which says their
# refusals: no path literal ("/api/...", "/apis/...", f-strings too) elsewhere, no raw PATCH.
def _api_paths(source: str) -> list[str]:
    found = (n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant))
    return [v for v in found if isinstance(v, str) and v.startswith(("/api/", "/apis/"))]


def test_api_paths_come_from_the_table_and_patches_from_the_client() -> None:
    assert _api_paths('p = f"/api/v1/namespaces/{ns}/pods"') == ["/api/v1/namespaces/"]
    found = []
    for path in (p for package in PRODUCT for p in sorted((REPO / package).rglob("*.py"))):
        rel, text = str(path.relative_to(REPO)), path.read_text()
        found += [f"{rel}: {hit!r}" for hit in _api_paths(text) if rel != "apis/kinds.py"]
        found += [f"{rel}: raw PATCH"] if 'raw("PATCH"' in text and rel != "allocator/runtime/kube.py" else []
    assert found == []
