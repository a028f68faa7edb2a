"""The runtime's ClusterCache (and the tests' in-memory fakes) fit the narrow views the extender and
gang scheduling type their code against: every member there, methods with the same parameters."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from allocator.claims.cache_view import ClaimsCache, ClaimsLedger, DraView
from allocator.extender.cache_view import BindLedger, ExtenderCache
from allocator.gang.cache_view import GangCache, GangLedger
from allocator.reservations.cache_view import ReservationCache, RoomLedger
from allocator.runtime.cache.store import ClusterCache
from allocator.runtime.coreadapter import NOT_IN_CACHE, CoreAdapter
from tests.claims.fakes import FakeClaimsCache
from tests.extender.fakes import FakeExtenderCache
from tests.gang.fakes import FakeGangCache

# Each view, and the view of the ledger it reaches through `ledger`.
VIEWS = [
    (ExtenderCache, BindLedger),
    (GangCache, GangLedger),
    (ReservationCache, RoomLedger),
    (ClaimsCache, ClaimsLedger),
]


def misfits(obj: object, view: type) -> list[str]:
    """What `obj` lacks of `view`: missing members, methods whose parameters differ."""
    out = []
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


def _fake_gang() -> Any:
    return FakeGangCache()


def _fake_extender() -> Any:
    return FakeExtenderCache(set(), lambda req, node: NOT_IN_CACHE)


@pytest.mark.parametrize(("view", "ledger"), VIEWS, ids=["extender", "gang", "reservations", "claims"])
def test_the_cluster_cache_fits_each_view(view: type, ledger: type) -> None:
    cache = ClusterCache(CoreAdapter())
    assert misfits(cache, view) == [] and isinstance(cache, view)
    assert misfits(cache.ledger, ledger) == [] and isinstance(cache.ledger, ledger)


def _fake_claims() -> Any:
    return FakeClaimsCache()


@pytest.mark.parametrize(
    ("fake", "view", "ledger"),
    [(_fake_extender, *VIEWS[0]), (_fake_gang, *VIEWS[1]), (_fake_claims, *VIEWS[3])],
)
def test_the_fakes_fit_the_view_they_stand_in_for(fake: Any, view: type, ledger: type) -> None:
    cache = fake()
    assert misfits(cache, view) == [] and misfits(cache.ledger, ledger) == []


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
