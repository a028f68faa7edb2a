"""What topoalloc's own identities ask of a real kube-apiserver, read from its audit log.

A control plane (tests/support/controlplane.py) started while `AUDIT_DIR_ENV` names a folder runs
kube-apiserver with `POLICY`: every request of the allocator's, the agent's and the secondary
scheduler's ServiceAccounts at Metadata level (who, verb, object, response code, the authorizer's
decision; never a body), nothing else. When it stops, the log is boiled down to the distinct
requests (`Request`) and saved as one JSON file in that folder; the tier's least-privilege check
(tests/cluster/least_privilege.py) reads every file of the session. No pytest here, so a benchmark
(the soak) can record the same way.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

AUDIT_DIR_ENV = "TOPOALLOC_API_AUDIT_DIR"
NAMESPACE = "topoalloc-system"
ALLOCATOR = f"system:serviceaccount:{NAMESPACE}:topoalloc-allocator"
AGENT = f"system:serviceaccount:{NAMESPACE}:topoalloc-agent"
SCHEDULER = f"system:serviceaccount:{NAMESPACE}:topoalloc-scheduler"
USERS = (ALLOCATOR, AGENT, SCHEDULER)
DECISION = "authorization.k8s.io/decision"

# Metadata only: enough to say which rule a request used, no object bodies in the log.
# RequestReceived is left out (every request also ends with ResponseComplete, or for a watch that
# outlives the server, ResponseStarted).
POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "users": list(USERS)}, {"level": "None"}],
}


@dataclass(frozen=True, order=True)
class Request:
    """One distinct request: `resource` is `""` for a non-resource URL (then `name` is the path);
    `denied` when the authorizer refused it (a refusal by admission is not a denial here)."""

    user: str
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    denied: bool

    @property
    def full_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> Request | None:
        """The request of one audit event; None for an impersonated one (a test probing rights
        through impersonation, not a process of the product) or another user's."""
        if event.get("impersonatedUser"):
            return None
        user = str((event.get("user") or {}).get("username", ""))
        if user not in USERS:
            return None
        ref = event.get("objectRef") or {}
        denied = (event.get("annotations") or {}).get(DECISION) == "forbid"
        if not ref:
            path = str(event.get("requestURI", "")).split("?")[0]
            return cls(user, str(event.get("verb", "")), "", "", "", "", path, denied)
        return cls(
            user,
            str(event.get("verb", "")),
            str(ref.get("apiGroup") or ""),
            str(ref.get("resource") or ""),
            str(ref.get("subresource") or ""),
            str(ref.get("namespace") or ""),
            str(ref.get("name") or ""),
            denied,
        )


def audit_args(workdir: Path) -> list[str]:
    """kube-apiserver's flags for recording into `workdir` (the policy file written there)."""
    workdir.mkdir(parents=True, exist_ok=True)
    policy = workdir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY, sort_keys=False))
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={workdir / 'audit.log'}",
        "--audit-log-format=json",
        "--audit-log-mode=blocking",  # written before the response: nothing lost at a SIGKILL
        "--audit-log-maxsize=0",  # never rotated away
    ]


def read_log(paths: Iterable[Path]) -> Counter[Request]:
    """The distinct requests of audit log files, with how many times each was made."""
    seen: Counter[Request] = Counter()
    ids: set[str] = set()  # a watch logs at ResponseStarted and again at ResponseComplete
    for path in paths:
        try:
            lines = path.open(encoding="utf-8", errors="replace")
        except OSError:
            continue
        with lines:
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:  # a line cut short by a killed server
                    continue
                audit_id = str(event.get("auditID", ""))
                if audit_id in ids:
                    continue
                ids.add(audit_id)
                request = Request.from_event(event)
                if request is not None:
                    seen[request] += 1
    return seen


def save(requests: Counter[Request], folder: Path, stem: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.audit.json"
    rows = [{**asdict(r), "count": n} for r, n in sorted(requests.items())]
    tmp = folder / f"{stem}.tmp"
    tmp.write_text(json.dumps(rows))
    tmp.replace(path)  # a reader never sees half a file
    return path


def record(workdir: Path, stem: str) -> Path | None:
    """Boil the audit log(s) in `workdir` down into AUDIT_DIR_ENV's folder, if recording."""
    folder = os.environ.get(AUDIT_DIR_ENV, "")
    if not folder:
        return None
    return save(read_log(sorted(workdir.glob("audit*.log"))), Path(folder), stem)


def load(folder: Path) -> Counter[Request]:
    """Every saved file of a folder, merged."""
    merged: Counter[Request] = Counter()
    for path in sorted(folder.glob("*.audit.json")):
        for row in _rows(path):
            count = int(row.pop("count", 1))
            merged[Request(**row)] += count
    return merged


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    try:
        yield from json.loads(path.read_text())
    except (OSError, ValueError):
        return
