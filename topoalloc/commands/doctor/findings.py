"""What a check says: a `Finding` (ok, warn or fail, what was found, the supporting lines, the
fix), the thresholds the checks judge by, and what the findings add up to (the exit status)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from topoalloc.errors import EXIT_FAILURE, EXIT_OK

OK, WARN, FAIL = "ok", "warn", "fail"
STATUSES = (OK, WARN, FAIL)
# At most this many lines of supporting detail per finding (the rest counted in one line).
MAX_DETAILS = 20


@dataclass(frozen=True)
class Finding:
    check: str  # the group: crds, allocator, webhooks, agents, plugins, scheduler, pods, claims, clock
    status: str  # OK, WARN or FAIL
    what: str  # one line: what was found
    fix: str = ""  # what to do about it (warn, fail)
    details: tuple[str, ...] = ()

    def as_data(self) -> dict[str, Any]:
        out: dict[str, Any] = {"check": self.check, "status": self.status, "what": self.what}
        if self.details:
            out["details"] = list(self.details)
        if self.fix:
            out["fix"] = self.fix
        return out


def ok(check: str, what: str, details: Iterable[str] = ()) -> Finding:
    return Finding(check, OK, what, details=capped(details))


def warn(check: str, what: str, fix: str, details: Iterable[str] = ()) -> Finding:
    return Finding(check, WARN, what, fix, capped(details))


def fail(check: str, what: str, fix: str, details: Iterable[str] = ()) -> Finding:
    return Finding(check, FAIL, what, fix, capped(details))


def capped(lines: Iterable[str]) -> tuple[str, ...]:
    out = list(lines)
    if len(out) > MAX_DETAILS:
        out = [*out[:MAX_DETAILS], f"... and {len(out) - MAX_DETAILS} more"]
    return tuple(out)


@dataclass(frozen=True)
class Thresholds:
    """How long is too long. `stale_after` None: from the agents' statusRefreshSeconds."""

    stale_after: float | None = None
    gated_after: float = 300.0  # a pod gated (or pending) this long is named
    prepare_after: float = 300.0  # a bound pod whose allocated claims are not prepared by then
    clock_skew: float = 5.0  # clocks further apart than this are named


@dataclass
class Summary:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))

    @classmethod
    def of(cls, findings: Iterable[Finding]) -> Summary:
        out = cls()
        for f in findings:
            out.counts[f.status] += 1
        return out

    @property
    def healthy(self) -> bool:
        return self.counts[FAIL] == 0

    @property
    def exit_status(self) -> int:
        """0 when nothing fails (warnings allowed), 1 when a check fails."""
        return EXIT_OK if self.healthy else EXIT_FAILURE

    def line(self) -> str:
        c = self.counts
        return f"{c[FAIL]} failed, {c[WARN]} warning(s), {c[OK]} ok"
