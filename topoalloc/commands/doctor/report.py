"""Every check run over the facts, in the order a user reads them, and the report: human lines or
the same as data (`-o json|yaml`)."""

from __future__ import annotations

from typing import Any

from topoalloc.commands.doctor import agents, allocator, crds, plugins, scheduling, waiting, webhooks
from topoalloc.commands.doctor.facts import NOT_INSTALLED, Facts
from topoalloc.commands.doctor.findings import FAIL, WARN, Finding, Summary, Thresholds


def run_checks(facts: Facts, limits: Thresholds) -> list[Finding]:
    return [
        *crds.check(facts),
        *allocator.check(facts, limits.clock_skew),
        *webhooks.check(facts),
        *agents.check(facts, limits.stale_after, limits.clock_skew),
        *plugins.check(facts),
        *scheduling.check(facts),
        *waiting.check(facts, limits.gated_after, limits.prepare_after),
    ]


def header(facts: Facts) -> dict[str, Any]:
    mode, how = facts.mode()
    record = facts.record or {}
    version = f"{record.get('image', 'topoalloc')}:{record['version']}" if record.get("version") else ""
    return {
        "cluster": facts.host,
        "kubernetes": facts.server_version,
        "mode": mode,
        "modeFrom": how,
        "installed": version,
    }


def as_data(facts: Facts, findings: list[Finding]) -> dict[str, Any]:
    summary = Summary.of(findings)
    return {
        **header(facts),
        "healthy": summary.healthy,
        "summary": summary.counts,
        "checks": [f.as_data() for f in findings],
    }


def render(facts: Facts, findings: list[Finding], *, verbose: bool = False) -> str:
    h = header(facts)
    installed = f", {h['installed']}" if h["installed"] else ""
    mode = "not installed" if h["mode"] == NOT_INSTALLED else f"{h['mode']} mode"
    lines = [
        f"cluster {h['cluster']} (Kubernetes {h['kubernetes']}){installed}, {mode} ({h['modeFrom']})",
        "",
    ]
    for f in findings:
        lines.append(f"{f.status.upper():<5} {f.check:<10} {f.what}")
        if verbose or f.status in (FAIL, WARN):
            lines += [f"{'':<17}{d}" for d in f.details]
        if f.fix:
            lines.append(f"{'':<17}fix: {f.fix}")
    lines += ["", Summary.of(findings).line()]
    return "\n".join(lines) + "\n"
