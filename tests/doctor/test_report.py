"""What the findings add up to: every check on a healthy installation ok and exit 0; one failure
makes exit 1 (warnings do not); the human report shows each failure's details and fix, the JSON
the same facts; long detail lists are cut with a count."""

from __future__ import annotations

import json

from tests.doctor.healthy import facts, iso
from topoalloc.commands.doctor.findings import FAIL, OK, WARN, Summary, Thresholds, capped, fail, warn
from topoalloc.commands.doctor.report import as_data, render, run_checks


def test_a_healthy_installation_is_all_ok_and_exits_0() -> None:
    f = facts()
    found = run_checks(f, Thresholds())
    assert {x.status for x in found} == {OK}
    assert {x.check for x in found} == {
        "crds",
        "allocator",
        "clock",
        "webhooks",
        "agents",
        "plugins",
        "scheduler",
        "pods",
        "claims",
    }
    summary = Summary.of(found)
    assert summary.healthy and summary.exit_status == 0
    text = render(f, found)
    assert text.splitlines()[0] == (
        "cluster https://cluster.test (Kubernetes v1.35.6), topoalloc:0.1.0, placement mode "
        "(recorded in ConfigMap topoalloc-system/topoalloc-install)"
    )
    assert text.endswith(f"\n0 failed, 0 warning(s), {len(found)} ok\n")
    assert "fix:" not in text and "gpu-a (selected by" not in text  # details of passing checks: -v only
    assert "gpu-a (selected by" in render(f, found, verbose=True)


def test_one_failure_exits_1_warnings_alone_exit_0() -> None:
    assert Summary.of([warn("x", "w", "do y")]).exit_status == 0
    assert Summary.of([warn("x", "w", "do y"), fail("x", "f", "do z")]).exit_status == 1


def test_a_failure_shows_its_details_and_fix_in_text_and_json() -> None:
    f = facts()
    f.devices[0]["status"]["updateTime"] = iso(3600)
    found = run_checks(f, Thresholds())
    text = render(f, found)
    assert "FAIL  agents     Device gpu-a is stale: last refreshed 60m ago (more than 10m)" in text
    assert "fix: is the agent on gpu-a running?" in text
    data = json.loads(json.dumps(as_data(f, found)))
    assert data["healthy"] is False and data["summary"] == {OK: len(found) - 1, WARN: 0, FAIL: 1}
    assert data["mode"] == "placement" and data["kubernetes"] == "v1.35.6"
    [stale] = [c for c in data["checks"] if c["status"] == FAIL]
    assert stale["check"] == "agents" and stale["fix"].startswith("is the agent on gpu-a running?")


def test_the_mode_without_a_record_is_what_is_there() -> None:
    f = facts()
    f.record = None
    assert f.mode() == ("placement", "no install record; the placement webhook is there")
    f.webhooks = None
    f.deployments["topoalloc-scheduler"] = {}
    assert f.mode()[0] == "secondary"


def test_details_are_capped_with_a_count() -> None:
    lines = capped(f"pod {i}" for i in range(25))
    assert len(lines) == 21 and lines[-1] == "... and 5 more"
