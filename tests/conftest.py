"""Suite-wide fixtures: the fake Kubernetes API server and official clients pointed at it.

- `fake_api`: a FakeApiServer running on the test's own event loop (async tests, `kubernetes.aio`).
  Do not call the sync `kubernetes` client from the loop thread here: it would block the server.
- `fake_api_thread`: a FakeApiServer on its own loop in a background thread (sync tests, sync client,
  code under test that runs its own threads). Its hooks may be called from any thread.
- `fake_api_aio_client` / `fake_api_sync_client`: an official ApiClient for those servers, closed after.
- `fake_api_settings`: the server's keyword arguments; override it in a module or conftest to change
  timings (for example a longer `bookmark_interval`).
- `pki`: the tests' throw-away PKI (tests/support/pki.py) in the test's own `tmp_path`: the
  allocator's serving certificate, kube-scheduler's client certificate and their CA.

Also here, since they must be in place before any test module is imported or any worker started:
the Hypothesis profiles (docs/testing.md) and pytest-xdist's scheduler for `make test`'s workers.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.support.fakeapi import FakeApiServer, ServerThread
from tests.support.pki import Pki

# Hypothesis profiles (docs/testing.md). Speed lives in bench/, not in unit tests: no deadline
# anywhere (a loaded machine or a busy second xdist worker would fail a correct example). 150
# examples unless a test says otherwise (what the suite ran with before the profiles existed).
settings.register_profile("dev", max_examples=150, deadline=None)
# CI (.ci/run; CI=true): the same examples on every run, derived from each test's source, so a
# random example never turns an unrelated change red; no example database to carry over. A failure
# found locally under "dev" is saved in .hypothesis/ and replayed first on the next local run.
settings.register_profile(
    "ci",
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
HYPOTHESIS_PROFILE = "ci" if os.environ.get("CI", "").lower() not in ("", "0", "false", "no") else "dev"
# Loaded on import, before test modules build their own `settings(...)` from the active profile;
# `--hypothesis-profile NAME` still overrides it.
settings.load_profile(HYPOTHESIS_PROFILE)


def pytest_collection_finish(session: pytest.Session) -> None:
    """A test module that loads a profile changes every module imported after it (and so what runs
    depends on which files were named): use a `@settings(...)` decorator instead."""
    wanted = session.config.getoption("hypothesis_profile", None) or HYPOTHESIS_PROFILE
    if settings.get_current_profile_name() != wanted:
        raise pytest.UsageError(
            f"Hypothesis profile {settings.get_current_profile_name()!r} was loaded while collecting"
            f" (expected {wanted!r}); give the tests a @settings(...) decorator instead"
        )


def pytest_configure(config: pytest.Config) -> None:
    """The real-cluster tier's API requests recorded and held against the RBAC of the manifests
    (tests/cluster/least_privilege.py): registered here, since under xdist the controller, which
    checks at the end, never loads tests/cluster/conftest.py."""
    from tests.cluster.least_privilege import LeastPrivilege

    config.pluginmanager.register(LeastPrivilege(config), "topoalloc-least-privilege")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """`-n N` alone distributes with `--dist loadgroup` (before xdist would pick `load`)."""
    if config.getoption("numprocesses", None) and config.getoption("dist", "no") == "no":
        config.option.dist = "loadgroup"


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` with each Kubernetes release's real-cluster tests on one worker."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.support.xdist_groups import ReleaseGroupScheduling

    return ReleaseGroupScheduling(config, log)


@pytest.fixture
def fake_api_settings() -> dict[str, Any]:
    """Short timings so watch behaviour shows within a test's budget."""
    return {
        "bookmark_interval": 0.3,
        "bookmark_before_timeout": 0.2,
        "future_rv_wait": 0.3,
        "default_watch_timeout": 30.0,
    }


@pytest.fixture
async def fake_api(fake_api_settings: dict[str, Any]) -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(**fake_api_settings) as server:
        yield server


@pytest.fixture
def fake_api_thread(fake_api_settings: dict[str, Any]) -> Iterator[FakeApiServer]:
    with ServerThread(FakeApiServer(**fake_api_settings)) as server:
        yield server


@pytest.fixture
async def fake_api_aio_client(fake_api: FakeApiServer) -> AsyncIterator[Any]:
    """`kubernetes.aio.client.ApiClient` for `fake_api`."""
    client = fake_api.aio_api_client()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def fake_api_sync_client(fake_api_thread: FakeApiServer) -> Iterator[Any]:
    """`kubernetes.client.ApiClient` for `fake_api_thread`."""
    with fake_api_thread.sync_api_client() as client:
        yield client


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")
