"""Which pods belong to which gang and which RL job group, kept from the watch cache's pod events.

Only pods that name a gang or carry `rl-job-group` are kept, with the few facts the controller,
the webhook and the extender hooks read. `generation` counts every change the cache reported, so a
gang that found no room retries only once something changed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from allocator.core.gang.view import MemberPod
from apis import keys
from apis.errors import CodecError
from apis.podgroup import GangRef, gang_of, spec_priority

JSON = dict[str, Any]


def member_of(key: str, pod: JSON) -> MemberPod | None:
    """The facts of a pod that names a gang or a job group; None for any other pod."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    try:
        gang, error = gang_of(pod), ""
    except (CodecError, AttributeError, TypeError) as exc:
        gang, error = None, str(exc)
    job = labels.get(keys.RL_JOB_GROUP, "") if isinstance(labels, dict) else ""
    if gang is None and not error and not job:
        return None
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    gates = tuple(g.get("name", "") for g in spec.get("schedulingGates") or [] if isinstance(g, dict))
    return MemberPod(
        key=key,
        namespace=meta.get("namespace") or "default",
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        gang=gang,
        gang_error=error,
        job_group=job if isinstance(job, str) else "",
        node=spec.get("nodeName") or "",
        phase=status.get("phase") or "",
        deleting=bool(meta.get("deletionTimestamp")),
        created=meta.get("creationTimestamp") or "",
        gates=gates,
        scheduler=spec.get("schedulerName") or "default-scheduler",
        annotations=dict(annotations) if isinstance(annotations, dict) else {},
        priority=spec_priority(spec),
    )


class GangIndex:
    def __init__(self) -> None:
        self.pods: dict[str, MemberPod] = {}
        self.by_gang: dict[str, set[str]] = defaultdict(set)
        self.by_job: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.generation = 0

    def on_change(self, kind: str, key: str, obj: JSON | None) -> None:
        """A ClusterCache listener."""
        self.generation += 1
        if kind == "Pod":
            self.update(key, obj)

    def update(self, key: str, pod: JSON | None) -> None:
        old = self.pods.pop(key, None)
        if old is not None:
            self._unlink(old)
        new = member_of(key, pod) if pod is not None else None
        if new is not None:
            self.pods[key] = new
            if new.gang is not None:
                self.by_gang[new.gang.key].add(key)
            if new.job_key is not None:
                self.by_job[new.job_key].add(key)

    def _unlink(self, old: MemberPod) -> None:
        for table, group in ((self.by_gang, old.gang_key), (self.by_job, old.job_key)):
            if not group:
                continue
            members = table.get(group)  # type: ignore[call-overload]
            if members is not None:
                members.discard(old.key)
                if not members:
                    del table[group]  # type: ignore[arg-type]

    def members(self, gang: str) -> list[MemberPod]:
        """The gang's pods, oldest first (then by name)."""
        found = [self.pods[k] for k in self.by_gang.get(gang, ())]
        return sorted(found, key=lambda m: (m.created, m.name))

    def ref(self, gang: str) -> GangRef | None:
        """The gang as its members name it; for Koordinator gangs the largest min-available any
        active member states."""
        members = self.members(gang)
        refs = [m.gang for m in members if m.gang is not None and m.active]
        refs = refs or [m.gang for m in members if m.gang is not None]
        return max(refs, key=lambda r: r.min_available or 0) if refs else None

    def siblings(self, key: str, gang: str, job: tuple[str, str] | None) -> Iterable[str]:
        """Pod keys of the pod's gang and job group, itself excluded."""
        out = set(self.by_gang.get(gang, ())) if gang else set()
        if job is not None:
            out |= self.by_job.get(job, set())
        out.discard(key)
        return out
