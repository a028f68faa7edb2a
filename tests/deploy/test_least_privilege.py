"""The least-privilege check's parts (tests/cluster/least_privilege.py): audit events read into
requests, the manifests' RBAC read into grants, matched as kube-apiserver's RBAC authorizer matches,
and the verdict over them; the real tier's data is checked at the end of a whole-tier run."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.least_privilege import ALLOWLIST, LeastPrivilege, check, refusals, tier_modules
from tests.support import api_audit
from tests.support.api_audit import AGENT, ALLOCATOR, SCHEDULER, Request
from tests.support.kube_releases import RELEASES
from tests.support.rbac_grants import Grant, grants, manifests, verdict

NS = "topoalloc-system"


def event(user: str = ALLOCATOR, verb: str = "get", **ref: str) -> dict[str, Any]:
    return {
        "auditID": f"{user}-{verb}-{sorted(ref.items())}",
        "stage": "ResponseComplete",
        "verb": verb,
        "user": {"username": user},
        "objectRef": ref,
        "annotations": {api_audit.DECISION: "allow"},
        "responseStatus": {"code": 200},
    }


def req(verb: str, resource: str, *, user: str = ALLOCATOR, group: str = "", sub: str = "", ns: str = "", name: str = "", denied: bool = False) -> Request:  # fmt: skip
    return Request(user, verb, group, resource, sub, ns, name, denied)


def test_an_event_becomes_a_request_and_impersonation_or_other_users_do_not() -> None:
    e = event(verb="patch", resource="pods", subresource="status", namespace="t1", name="p")
    assert Request.from_event(e) == req("patch", "pods", sub="status", ns="t1", name="p")
    assert Request.from_event({**e, "impersonatedUser": {"username": AGENT}}) is None
    assert Request.from_event({**e, "user": {"username": "system:kube-scheduler"}}) is None
    forbidden = {**e, "annotations": {api_audit.DECISION: "forbid"}, "responseStatus": {"code": 403}}
    assert Request.from_event(forbidden).denied  # type: ignore[union-attr]
    # refused by admission (the agent's policy), not by RBAC: not a missing rule
    admission = {**e, "responseStatus": {"code": 403}}
    assert not Request.from_event(admission).denied  # type: ignore[union-attr]
    discovery = {**event(), "objectRef": None, "requestURI": "/apis/policy/v1?timeout=32s"}
    assert Request.from_event(discovery) == req("get", "", name="/apis/policy/v1")


def test_a_log_is_read_once_per_request_and_a_cut_line_skipped(tmp_path: Path) -> None:
    watch = event(verb="watch", resource="nodes")
    lines = [
        json.dumps({**watch, "stage": "ResponseStarted"}),
        json.dumps(watch),  # the same watch ending
        json.dumps(event(verb="list", resource="nodes")),
        '{"kind":"Event","auditID":"cut sh',
    ]
    (tmp_path / "audit.log").write_text("\n".join(lines) + "\n")
    seen = api_audit.read_log([tmp_path / "audit.log"])
    assert seen == Counter({req("watch", "nodes"): 1, req("list", "nodes"): 1})
    api_audit.save(seen, tmp_path / "out", "a")
    api_audit.save(seen, tmp_path / "out", "b")
    assert api_audit.load(tmp_path / "out") == Counter({req("watch", "nodes"): 2, req("list", "nodes"): 2})


def test_grants_match_as_the_rbac_authorizer_does() -> None:
    lease = Grant(ALLOCATOR, "Role/x", "coordination.k8s.io", "leases", "get", NS, ("topoalloc-allocator",))
    get = req("get", "leases", group="coordination.k8s.io", ns=NS, name="topoalloc-allocator")
    assert lease.covers(get)
    assert not lease.covers(req("get", "leases", group="coordination.k8s.io", ns=NS, name="other"))
    assert not lease.covers(
        req("get", "leases", group="coordination.k8s.io", ns="t1", name="topoalloc-allocator")
    )
    assert not lease.covers(dataclasses.replace(get, user=AGENT))  # another user
    # resourceNames never cover a create (RBAC cannot check a name that does not exist yet)
    named_create = Grant(ALLOCATOR, "Role/x", "", "configmaps", "create", NS, ("r",))
    assert not named_create.covers(req("create", "configmaps", ns=NS, name="r"))
    status = Grant(ALLOCATOR, "ClusterRole/x", "", "pods/status", "patch")
    assert status.covers(req("patch", "pods", sub="status", ns="t1", name="p"))
    assert not status.covers(req("patch", "pods", ns="t1", name="p"))


def test_the_verdict_names_unused_grants_refusals_and_stale_allowlist_entries() -> None:
    used = Grant(ALLOCATOR, "ClusterRole/a", "", "pods", "list")
    unused = Grant(ALLOCATOR, "ClusterRole/a", "", "pods", "delete")
    allowed = Grant(ALLOCATOR, "ClusterRole/a", "", "nodes", "get")
    stale = Grant(ALLOCATOR, "ClusterRole/a", "", "pods", "watch")
    requests = [
        req("list", "pods"),
        req("watch", "pods"),
        req("create", "pods", sub="eviction", ns="t", name="p", denied=True),  # no rule: missing
        req("list", "pods", denied=True),  # covered: refused while RBAC was loading, not missing
        # Kubernetes' own discovery roles cover these for every account: refused while loading
        req("get", "", name="/apis/scheduling.k8s.io/v1alpha2", denied=True),
        req("get", "", name="/version", denied=True),
        req("get", "", name="/metrics", denied=True),  # no built-in role: missing
        req("get", "secrets", user="system:serviceaccount:other:x", denied=True),  # not ours
    ]
    got = verdict([used, unused, allowed, stale], requests, {allowed: "why", stale: "why"})
    assert got.unused == [unused]
    assert got.missing == [
        req("create", "pods", sub="eviction", ns="t", name="p", denied=True),
        req("get", "", name="/metrics", denied=True),
    ]
    assert got.allowed_unused == [allowed] and got.stale_allowlist == [stale]
    assert got.uncovered == []
    # allowed by none of the manifests' rules: something else authorized it
    extra = req("get", "secrets", ns="t")
    assert verdict([used], [extra], only_ours=[ALLOCATOR]).uncovered == [extra]
    assert verdict([used], [extra]).uncovered == []  # an account with built-in roles too
    # a denied request never counts as use
    assert verdict([unused], [req("delete", "pods", denied=True)]).unused == [unused]


def test_the_manifests_grants_each_account_its_roles_and_no_built_in_one() -> None:
    granted = grants(manifests())
    users = {g.user for g in granted}
    assert users == {ALLOCATOR, AGENT, SCHEDULER}
    lease = [g for g in granted if g.user == ALLOCATOR and g.group == "coordination.k8s.io"]
    assert {(g.verb, g.namespace, g.names) for g in lease} == {
        ("create", NS, ()),
        ("get", NS, ("topoalloc-allocator",)),
        ("update", NS, ("topoalloc-allocator",)),
    }
    # kube-scheduler's built-in roles bound to the secondary scheduler are Kubernetes', not ours
    assert all(not g.role.startswith("ClusterRole/system:") for g in granted)
    assert {g.role for g in granted if g.user == SCHEDULER} == {
        "Role/topoalloc-system/topoalloc-scheduler-leader-election"
    }


def test_the_allowlist_names_only_real_grants_each_with_a_reason() -> None:
    granted = set(grants(manifests()))
    for grant, why in ALLOWLIST.items():
        assert grant in granted, f"{grant} is not granted: take it off the allowlist"
        assert len(why) > 20, grant


def test_an_empty_record_finds_every_grant_unused() -> None:
    assert len(check(Counter())) == len(grants(manifests())) - len(ALLOWLIST)


def test_a_part_of_the_tier_is_held_to_its_refusals_not_to_unused_grants() -> None:
    assert refusals(Counter()) == []  # nothing requested: no grant is judged unused here
    refused = req("delete", "nodes", name="n", denied=True)  # no rule of ours lets it delete nodes
    granted_elsewhere = req("get", "secrets", ns="t")  # allowed, yet no rule of ours covers it
    assert refusals(Counter([refused, granted_elsewhere])) == [
        "refused for want of a rule: system:serviceaccount:topoalloc-system:topoalloc-allocator:"
        " delete core/nodes",
        "allowed by no rule of the manifests: system:serviceaccount:topoalloc-system:topoalloc-allocator:"
        " get core/secrets in t",
    ]


class _Report:
    def __init__(self, nodeid: str, when: str = "call", skipped: bool = False) -> None:
        self.nodeid, self.when, self.skipped = nodeid, when, skipped


@pytest.mark.parametrize("partial", [True, False])
def test_the_check_runs_only_when_every_module_ran_on_every_release(partial: bool) -> None:
    plugin = LeastPrivilege(config=None)  # type: ignore[arg-type]
    modules = sorted(tier_modules())
    for module in modules[1:] if partial else modules:
        for release in RELEASES.values():
            plugin.pytest_runtest_logreport(_Report(f"tests/cluster/{module}::t[{release.test_id}-x]"))  # type: ignore[arg-type]
    plugin.pytest_runtest_logreport(_Report(f"tests/cluster/{modules[0]}::t[k8s-1.35]", "teardown"))  # type: ignore[arg-type]
    missing = plugin.missing_from_tier()
    if partial:
        assert missing == sorted(f"{modules[0]}[{r.test_id}]" for r in RELEASES.values())
    else:
        assert missing == []


def test_a_tier_skipped_whole_is_not_a_tier_that_ran() -> None:
    """Without the Kubernetes binaries every test of the tier is skipped: nothing was recorded,
    so the check must not run (it would find every grant unused)."""
    plugin = LeastPrivilege(config=None)  # type: ignore[arg-type]
    for module in tier_modules():
        for release in RELEASES.values():
            nodeid = f"tests/cluster/{module}::t[{release.test_id}]"
            plugin.pytest_runtest_logreport(_Report(nodeid, "setup", skipped=True))  # type: ignore[arg-type]
    assert plugin.missing_from_tier() == sorted(
        f"every test skipped on {r.test_id}" for r in RELEASES.values()
    )
    one = f"tests/cluster/{sorted(tier_modules())[0]}::t[k8s-1.35]"
    plugin.pytest_runtest_logreport(_Report(one, "call"))  # type: ignore[arg-type]
    assert plugin.missing_from_tier() == ["every test skipped on k8s-1.36"]
