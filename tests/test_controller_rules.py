"""One way to run a controller, checked:

* every controller of the allocator (allocator/<component>/controller.py) runs on the one runner
  (allocator/runtime/runner.py): it builds a `Runner` and spells no loop of its own (no `while
  True`, no wake event, no sleep), and stays under `CONTROLLER_LINES` lines: decisions live in the
  core's lifecycles, writes in the component's writes modules;
* a component that is off is absent, never `None`: no `self.<component> is None` (or `is not
  None`, or through `svc.`/`service.`) anywhere in allocator/ or agent/ outside the pure core, whose
  data may well name a gang (null objects and lists stand in);
* no controller LISTs from the API server: the watch cache holds what a pass reads, so the only
  LISTs in the allocator are the reflector's (the one-shot CLI may LIST).

Each rule is fed a synthetic violation too, so it is known to fail when broken.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTROLLER_LINES = 250
RUNNER = "Runner"
# What holds a component (or an optional part of the agent) wherever it is kept.
COMPONENT_NAMES = frozenset(
    {
        # the allocator's components and the process parts assembly builds from the config
        "gang",
        "reservations",
        "claims",
        "defrag",
        "scarce",
        "placement",
        "steering",
        "admission",
        "webhook_tls",
        # the agent's parts (agent/parts.py, agent/cluster_side.py)
        "device_plugins",
        "dra_plugin",
        "publisher",
        "slices",
        "mid",
        "hotplug",
        "cluster",
    }
)
# The objects components are kept on (the process, the service view, the agent).
HOLDERS = frozenset({"self", "svc", "service"})
# Where the allocator may LIST: the watch cache's reflector.
LISTS_ALLOWED = ("allocator/runtime/cache/reflector.py",)
LIST_CALLS = frozenset({"list", "list_pages"})


def controllers(root: Path = REPO) -> list[Path]:
    return sorted((root / "allocator").glob("*/controller.py"))


def loop_spelled(source: str) -> list[str]:
    """What in a controller module is a loop of its own rather than the runner's."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.While) and isinstance(node.test, ast.Constant) and node.test.value is True:
            found.append(f"line {node.lineno}: while True")
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name in ("asyncio.Event", "asyncio.sleep", "time.sleep"):
                found.append(f"line {node.lineno}: {name}")
    if RUNNER not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}:
        found.append(f"no {RUNNER}")
    return found


def none_checks_on_components(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare) or len(node.ops) != 1:
            continue
        if not isinstance(node.ops[0], ast.Is | ast.IsNot):
            continue
        right = node.comparators[0]
        if not (isinstance(right, ast.Constant) and right.value is None):
            continue
        left = node.left
        if (
            isinstance(left, ast.Attribute)
            and isinstance(left.value, ast.Name)
            and left.value.id in HOLDERS
            and left.attr in COMPONENT_NAMES
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def lists(source: str) -> list[str]:
    """Calls of the API client's LIST (`api.list(...)`, `self.api.list_pages(...)`) and GETs of a
    collection (`api.raw("GET", PODS.path())`: a path of the table with no object's name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if ast.unparse(node.func.value).split(".")[-1] != "api":
            continue
        if node.func.attr in LIST_CALLS:
            found.append(f"line {node.lineno}: {ast.unparse(node.func)}")
        elif node.func.attr == "raw" and _get_of_a_collection(node.args):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _get_of_a_collection(args: list[ast.expr]) -> bool:
    if len(args) < 2 or not (isinstance(args[0], ast.Constant) and args[0].value == "GET"):
        return False
    path = args[1]
    return (
        isinstance(path, ast.Call)
        and isinstance(path.func, ast.Attribute)
        and path.func.attr == "path"
        and not path.args
        and not any(k.arg == "name" for k in path.keywords)
    )


def _modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py") if "_pb2" not in p.name)


def test_there_are_controllers_to_check() -> None:
    names = {p.parent.name for p in controllers()}
    assert {"claims", "gang", "reservations", "defrag"} <= names, names


def test_every_controller_runs_on_the_runner_and_stays_small() -> None:
    problems = []
    for path in controllers():
        source = path.read_text()
        lines = source.count("\n")
        if lines > CONTROLLER_LINES:
            problems.append(f"{path.relative_to(REPO)}: {lines} lines (at most {CONTROLLER_LINES})")
        problems += [f"{path.relative_to(REPO)}: {p}" for p in loop_spelled(source)]
    assert problems == []


def test_no_component_is_checked_for_none() -> None:
    problems = [
        f"{path.relative_to(REPO)}: {p}"
        for path in _modules("allocator", "agent")
        if "fixtures" not in path.parts and "core" not in path.parts
        for p in none_checks_on_components(path.read_text())
    ]
    assert problems == []


def test_no_controller_lists_from_the_api_server() -> None:
    problems = [
        f"{path.relative_to(REPO)}: {p}"
        for path in _modules("allocator")
        if str(path.relative_to(REPO)) not in LISTS_ALLOWED
        for p in lists(path.read_text())
    ]
    assert problems == []


def test_the_rules_catch_what_breaks_them() -> None:
    own_loop = (
        "import asyncio\nclass C:\n    async def run(self):\n        while True:\n"
        "            await asyncio.sleep(1)\n"
    )
    assert loop_spelled(own_loop) == ["line 4: while True", "line 5: asyncio.sleep", "no Runner"]
    assert loop_spelled("from x import Runner\nr = Runner('c', None)\n") == []
    checked = (
        "if self.gang is not None:\n    pass\nif svc.claims is None:\n    pass\n"
        "if req.gang is None or gang is None or self.pod is None:\n    pass\n"
    )
    assert none_checks_on_components(checked) == [
        "line 1: self.gang is not None",
        "line 3: svc.claims is None",
    ]
    listing = (
        "async def f(self):\n    await self.api.list(PODS)\n    await api.list_pages(PDBS)\n    x.list()\n"
    )
    assert lists(listing) == ["line 2: self.api.list", "line 3: api.list_pages"]
