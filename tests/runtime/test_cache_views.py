"""The runtime's ClusterCache (and the tests' in-memory fakes) fit the narrow views every component
types its code against (allocator/<component>/cache_view.py, each found by scanning allocator/):
every member there, methods with the same parameters, and the views its members return (`ledger`,
`dra`) fitted by what those members are."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from allocator.claims.cache_view import DraView
from allocator.extender.cache_view import ExtenderCache
from allocator.runtime.cache.store import ClusterCache
from allocator.runtime.coreadapter import NOT_IN_CACHE, CoreAdapter
from tests.claims.fakes import FakeClaimsCache
from tests.extender.fakes import FakeExtenderCache
from tests.gang.fakes import FakeGangCache

REPO = Path(__file__).resolve().parents[2]
# Every component with a view of the cache.
VIEW_MODULES = sorted(p.parent.name for p in (REPO / "allocator").glob("*/cache_view.py"))


def misfits(obj: object, view: type) -> list[str]:
    """What `obj` lacks of `view`: missing members, methods whose parameters differ."""
    out = [f"{name}: missing" for name in getattr(view, "__annotations__", {}) if not hasattr(obj, name)]
    for name, declared in vars(view).items():
        if name.startswith("_"):
            continue
        if not hasattr(obj, name):
            out.append(f"{name}: missing")
        elif inspect.isfunction(declared):
            want = list(inspect.signature(declared).parameters.values())[1:]  # without self
            got = list(inspect.signature(getattr(obj, name)).parameters.values())
            if [(p.name, p.kind) for p in want] != [(p.name, p.kind) for p in got]:
                out.append(f"{name}: parameters {[p.name for p in got]}, not {[p.name for p in want]}")
    return out


def views_of(module: ModuleType) -> dict[str, type]:
    """The Protocol classes `module` defines, by name."""
    return {
        name: c
        for name, c in vars(module).items()
        if isinstance(c, type) and getattr(c, "_is_protocol", False) and c.__module__ == module.__name__
    }


def _returned_views(view: type, views: dict[str, type]) -> dict[str, type]:
    """view's properties that return another of `views` (annotations are postponed: names)."""
    return {
        name: views[declared.fget.__annotations__.get("return")]
        for name, declared in vars(view).items()
        if isinstance(declared, property) and declared.fget.__annotations__.get("return") in views
    }


def cache_misfits(cache: object, module: ModuleType) -> list[str]:
    """What `cache` lacks of a cache_view module: the views no other view returns are the cache's
    own; each view a member returns is checked against that member of the cache."""
    views = views_of(module)
    returned = {v.__name__ for view in views.values() for v in _returned_views(view, views).values()}
    out: list[str] = []

    def check(obj: object, view: type, where: str) -> None:
        out.extend(f"{where}: {m}" for m in misfits(obj, view))
        if getattr(view, "_is_runtime_protocol", False) and not isinstance(obj, view):
            out.append(f"{where}: does not pass isinstance({view.__name__})")
        for member, inner in _returned_views(view, views).items():
            if hasattr(obj, member):
                check(getattr(obj, member), inner, f"{where}.{member}")

    for name, view in views.items():
        if name not in returned:
            check(cache, view, name)
    return out


@pytest.mark.parametrize("component", VIEW_MODULES)
def test_the_cluster_cache_fits_every_components_view(component: str) -> None:
    module = importlib.import_module(f"allocator.{component}.cache_view")
    assert views_of(module)
    assert cache_misfits(ClusterCache(CoreAdapter()), module) == []


def test_every_component_with_a_view_is_found() -> None:
    """The scan is not silently empty: at least the views there are today are found."""
    assert {"claims", "defrag", "extender", "gang", "reservations"} <= set(VIEW_MODULES)


def _fake_gang() -> Any:
    return FakeGangCache()


def _fake_extender() -> Any:
    return FakeExtenderCache(set(), lambda req, node: NOT_IN_CACHE)


def _fake_claims() -> Any:
    return FakeClaimsCache()


@pytest.mark.parametrize(
    ("fake", "component"),
    [(_fake_extender, "extender"), (_fake_gang, "gang"), (_fake_claims, "claims")],
    ids=["extender", "gang", "claims"],
)
def test_the_fakes_fit_the_view_they_stand_in_for(fake: Any, component: str) -> None:
    assert cache_misfits(fake(), importlib.import_module(f"allocator.{component}.cache_view")) == []


EXAMPLE_VIEW = """
from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class ExampleLedger(Protocol):
    landlord: object

    def rent_room(self, key: str) -> None: ...


@runtime_checkable
class ExampleCache(Protocol):
    @property
    def pods(self) -> dict: ...

    @property
    def ledger(self) -> ExampleLedger: ...

    @property
    def gossip(self) -> int: ...
"""


def test_a_view_the_cache_does_not_fit_is_named(tmp_path: Path) -> None:
    path = tmp_path / "example_cache_view.py"
    path.write_text(EXAMPLE_VIEW)
    spec = importlib.util.spec_from_file_location("example_cache_view", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert cache_misfits(ClusterCache(CoreAdapter()), module) == [
        "ExampleCache: gossip: missing",
        "ExampleCache: does not pass isinstance(ExampleCache)",
        "ExampleCache.ledger: landlord: missing",
        "ExampleCache.ledger: rent_room: missing",
        "ExampleCache.ledger: does not pass isinstance(ExampleLedger)",
    ]


def test_a_misfit_is_named() -> None:
    class Half:
        def __init__(self) -> None:
            self.pods: dict[str, Any] = {}

        def pod(self, ns: str, name: str) -> None:
            return None

    assert misfits(Half(), ExtenderCache) == [
        "ledger: missing",
        "budgets: missing",
        "pod: parameters ['ns', 'name'], not ['namespace', 'name']",
    ]
    assert not isinstance(Half(), ExtenderCache)


def test_the_dra_part_of_the_cache_and_its_fake_fit_the_claims_view() -> None:
    for dra in (ClusterCache(CoreAdapter()).dra, FakeClaimsCache().dra):
        assert misfits(dra, DraView) == [] and isinstance(dra, DraView)
