"""Least privilege, measured: every request the allocator, the agent and the secondary scheduler
make across the real-cluster tier is recorded from kube-apiserver's audit log
(tests/support/api_audit.py), and at the end of a session that ran the whole tier (every module of
tests/cluster on every release) the manifests' RBAC (tests/support/rbac_grants.py) is held against
it. The run fails when a Role or ClusterRole grants a verb on a resource that no request used (and
the allowlist below does not explain), when the authorizer refused a request no rule covers, or
when the allocator or the agent was allowed a request no rule of the manifests covers (then
something other than their RBAC authorized it).

The processes run under the manifests' own RBAC with their ServiceAccounts' tokens (the agent's
bound to a pod on its node), never as an administrator: a missing rule shows as a refused request.

A session-end hook, not a test, because under `make test`'s two workers each worker runs one
release: each worker's control planes save their requests into the session's folder (`AUDIT_DIR_ENV`,
set before the workers start), and the controller, which sees every test's report, decides whether
the whole tier ran and checks. A partial run (one module, `-k`, one release) records and reports
where the file is, and skips the check; with `TOPOALLOC_RBAC_CHECK=1` (.ci/run) a partial tier is
itself a failure, so CI can never skip it silently.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support import api_audit
from tests.support.api_audit import AGENT, ALLOCATOR, Request
from tests.support.kube_releases import RELEASE_IN_TEST_ID, RELEASES
from tests.support.rbac_grants import Grant, grants, manifests, table, verdict

ENFORCE_ENV = "TOPOALLOC_RBAC_CHECK"
HERE = Path(__file__).parent

# Grants no request of the tier uses, kept because a path the tier does not drive needs them. Each
# says which path and why the tier does not reach it. An entry that the tier does use fails the
# check too (take it off).
ALLOWLIST: dict[Grant, str] = {
    Grant(
        ALLOCATOR,
        "ClusterRole/topoalloc-allocator",
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        "patch",
        names=("topoalloc-gang",),
    ): (
        "the leader writes the webhooks' caBundle when it is not the CA in its TLS Secret"
        " (allocator/runtime/cabundle.py): always with cert-manager's certificates (deploy/cert-manager"
        " ships no bundle), and after a rotation; the tier's installations carry the right bundle from"
        " `topoalloc certs` and `install` (the patch: tests/gang/test_deploy.py, fake API server)"
    ),
    Grant(AGENT, "ClusterRole/topoalloc-agent", "resource.k8s.io", "resourceslices", "delete"): (
        "a pool that needs fewer ResourceSlices than the node has (devices gone) deletes the extra ones"
        " (agent/dra/slice_publisher.py); no pool shrinks in the tier (the deletion:"
        " tests/agent/dra/test_slice_publisher.py, tests/agent/test_daemonset.py, fake API server)"
    ),
    Grant(
        ALLOCATOR, "ClusterRole/topoalloc-allocator", "resource.k8s.io", "resourceclaims/binding", "patch"
    ): (
        "kube-apiserver 1.36 checks this synthetic subresource inside the allocator's write of a claim's"
        " status.allocation (DRAResourceClaimGranularStatusAuthorization): an authorization check of"
        " the resourceclaims/status patch, never a request of its own, so no audit event names it"
    ),
    Grant(ALLOCATOR, "ClusterRole/topoalloc-allocator", "apps", "statefulsets", "get"): (
        "defragmentation reads a StatefulSet's maxUnavailable before moving its pods"
        " (allocator/defrag/workloads.py); test_defrag.py moves only a Deployment's pods (the limit"
        " itself: tests/defrag/test_workloads.py)"
    ),
}


def tier_modules() -> set[str]:
    return {p.name for p in HERE.glob("test_*.py")}


class LeastPrivilege:
    """The pytest plugin (registered by tests/conftest.py)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.ran: set[tuple[str, str]] = set()  # (module, release test id) with a test reported
        self.executed: set[str] = set()  # releases on which some test really ran (not skipped)
        self.folder: Path | None = None
        self.outcome: list[str] = []

    @pytest.hookimpl(tryfirst=True)  # before xdist starts the workers, which inherit the variable
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if os.environ.get(api_audit.AUDIT_DIR_ENV):  # a worker: the controller chose the folder
            self.folder = Path(os.environ[api_audit.AUDIT_DIR_ENV])
            return
        factory = session.config._tmp_path_factory  # type: ignore[attr-defined]
        self.folder = factory.getbasetemp() / "api-audit"
        self.folder.mkdir(parents=True, exist_ok=True)
        os.environ[api_audit.AUDIT_DIR_ENV] = str(self.folder)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path = report.nodeid.split("::")[0]
        if not path.startswith("tests/cluster/test_") or report.when not in ("setup", "call"):
            return
        found = RELEASE_IN_TEST_ID.search(report.nodeid)
        if found:
            self.ran.add((Path(path).name, found.group(1)))
            if report.when == "call" and not report.skipped:
                self.executed.add(found.group(1))

    def missing_from_tier(self) -> list[str]:
        """What the whole tier has that this session did not run: modules per release (a module
        whose tests a release skips, 1.36-only ones, still ran there), or a release whose every test
        was skipped (the binaries missing)."""
        releases = [r.test_id for r in RELEASES.values()]
        missing = [f"{m}[{r}]" for m in tier_modules() for r in releases if (m, r) not in self.ran]
        return sorted(missing + [f"every test skipped on {r}" for r in releases if r not in self.executed])

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput") or self.folder is None:
            return  # a worker: the controller checks
        enforce = os.environ.get(ENFORCE_ENV) == "1"
        if not self.ran and not enforce:
            return  # no cluster test: nothing to say
        requests = api_audit.load(self.folder)
        report = self.folder / "requests.json"
        report.write_text(json.dumps(summary(requests), indent=1))
        self.outcome.append(f"API requests of topoalloc's identities: {report}")
        absent = self.missing_from_tier()
        if absent:
            shown = ", ".join(absent[:6]) + (" ..." if len(absent) > 6 else "")
            self.outcome.append(f"least-privilege check skipped: not the whole tier ran (missing {shown})")
            if enforce:
                self.outcome.append(f"{ENFORCE_ENV}=1: the whole tier must run")
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
            return
        problems = check(requests)
        self.outcome += problems or ["least-privilege check: every grant used, no request refused"]
        if problems:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.outcome:
            terminalreporter.section("least privilege")
            for line in self.outcome:
                terminalreporter.write_line(line)


def check(requests: Counter[Request]) -> list[str]:
    """What is wrong with the manifests' RBAC against these requests (nothing: [])."""
    result = verdict(grants(manifests()), requests, ALLOWLIST, only_ours=(ALLOCATOR, AGENT))
    lines = [f"granted but never requested: {g}" for g in result.unused]
    lines += [f"refused for want of a rule: {_show(r)}" for r in result.missing]
    lines += [f"on the allowlist but requested: {g} (take it off)" for g in result.stale_allowlist]
    lines += [f"allowed by no rule of the manifests: {_show(r)}" for r in result.uncovered]
    return lines


def refusals(requests: Counter[Request]) -> list[str]:
    """The half of `check` that holds for any part of the tier, such as one soak: requests refused
    for want of a rule, and requests of the allocator or the agent that no manifest rule covers.
    (Grants unused by a part prove nothing: the whole tier is where every grant must be used.)"""
    result = verdict(grants(manifests()), requests, ALLOWLIST, only_ours=(ALLOCATOR, AGENT))
    lines = [f"refused for want of a rule: {_show(r)}" for r in result.missing]
    return lines + [f"allowed by no rule of the manifests: {_show(r)}" for r in result.uncovered]


def _show(r: Request) -> str:
    where = f" in {r.namespace}" if r.namespace else ""
    what = f"{r.group or 'core'}/{r.full_resource}" if r.resource else r.name
    return f"{r.user}: {r.verb} {what}{where}"


def summary(requests: Counter[Request]) -> dict[str, Any]:
    """The session file: each (user, verb, resource, namespace) with its count (test namespaces
    folded into `*`, names left out), then each grant with the requests it covered."""
    rows: Counter[tuple[str, ...]] = Counter()
    for r, n in requests.items():
        namespace = r.namespace if r.namespace in ("", api_audit.NAMESPACE) else "*"
        what = f"{r.group or 'core'}/{r.full_resource}" if r.resource else r.name
        rows[(r.user, r.verb, what, namespace, "denied" if r.denied else "")] += n
    return {
        "requests": [[*k, n] for k, n in sorted(rows.items())],
        "grants": table(grants(manifests()), requests),
    }
