"""The real-cluster tier (marker `cluster`): one control plane per Kubernetes release for the
whole session (every test runs on v1.35.6 and on v1.36.3, tests/support/kube_releases.py;
TOPOALLOC_K8S_VERSIONS narrows it), a fresh namespace per test, the logs of every process attached
to a failing test's report. `@pytest.mark.k8s(min="1.36")` keeps a test to the releases it needs.

Runs whenever ../shared/k8s, ../shared/k8s-1.36, etcd and kubectl are present; under .ci/run
(TOPOALLOC_REQUIRE_SHARED=1) their absence fails the tier instead of skipping it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apis.paths import require_shared
from tests.cluster.gang_sources import GangSource
from tests.cluster.harness import ClusterEnv
from tests.support.kube_releases import KubeRelease, selected_releases

_names = itertools.count()
HERE = Path(__file__).parent
_running: list[ClusterEnv] = []


def _in_tier(item: pytest.Item | None) -> bool:
    return item is not None and HERE in Path(str(item.fspath)).parents


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _in_tier(item):
            item.add_marker(pytest.mark.cluster)
            # Under pytest-xdist (`--dist loadgroup`, as `make test` runs) a release's tests all go to
            # one worker, so each worker starts one control plane, not every release's.
            # (tests/support/xdist_groups.py also reads the release from the test id, since pytest
            # 9.2 undoes the mark's effect.)
            release = getattr(item, "callspec", None) and item.callspec.params.get("release")
            if isinstance(release, KubeRelease):
                item.add_marker(pytest.mark.xdist_group(release.test_id))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """The control plane and its agents cost CPU even idle: stop them after the tier's last test
    (once its fixtures are torn down) rather than at the end of the whole session."""
    yield
    if _in_tier(item) and not _in_tier(nextitem):
        while _running:
            _running.pop().stop()


@pytest.fixture(scope="session", params=selected_releases(), ids=lambda r: r.test_id)
def release(request: pytest.FixtureRequest) -> KubeRelease:
    """The Kubernetes release of this run of the test (pytest groups the tests by it, so each
    release's control plane is started once and stopped before the next one starts)."""
    return request.param


@pytest.fixture(autouse=True)
def _release_marker(request: pytest.FixtureRequest) -> None:
    """Skip a test marked `k8s(min="1.36")` (or `max=`) on the releases outside its range."""
    marker = request.node.get_closest_marker("k8s")
    if marker is None or "release" not in request.fixturenames:
        return
    release: KubeRelease = request.getfixturevalue("release")
    low, high = marker.kwargs.get("min"), marker.kwargs.get("max")
    if (low and release.minor_int < _minor(low)) or (high and release.minor_int > _minor(high)):
        pytest.skip(f"needs Kubernetes {low or ''}..{high or ''}, this run is {release.version}")


def _minor(text: str) -> int:
    return int(text.lstrip("v").split(".")[1])


@pytest.fixture(scope="session")
def cluster(release: KubeRelease, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterEnv]:
    require_shared(release.missing_parts())
    env = ClusterEnv(tmp_path_factory.mktemp(f"cluster-{release.minor}"), release=release)
    try:
        env.start()
    except BaseException:
        print(_logs(env))
        env.stop()
        raise
    _running.append(env)
    try:
        yield env
    finally:
        env.stop()
        if env in _running:
            _running.remove(env)


@pytest.fixture
def ns(cluster: ClusterEnv) -> Iterator[str]:
    """A fresh namespace; its pods are deleted with grace period 0 afterwards (no kubelet)."""
    name = f"t{next(_names)}"
    cluster.cp.create_namespace(name)
    yield name
    cluster.delete_pods(name)
    cluster.cp.admin.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture(scope="module")
def gang_source(
    request: pytest.FixtureRequest, cluster: ClusterEnv, release: KubeRelease
) -> Iterator[GangSource]:
    """The gang source a module's scenarios run with (parametrised indirectly by the module:
    `pytestmark = gang_sources(...)`), on the releases that serve it; the one without kube-scheduler's
    gang plugin restarts kube-scheduler and the allocator for the module, and back after it."""
    source: GangSource = request.param
    if release.minor not in source.releases:
        pytest.skip(f"{source.id} gangs are not served by Kubernetes {release.minor}")
    if source.kube_scheduler_plugin:
        yield source
        return
    cluster.kube_scheduler_gang_plugin(False)
    try:
        yield source
    finally:
        cluster.kube_scheduler_gang_plugin(True)


def _logs(env: ClusterEnv, lines: int = 60) -> str:
    return "\n".join(p.tail(lines) for p in env.processes())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    env = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and isinstance(env, ClusterEnv):
        report.sections.append(("process logs", _logs(env)))
