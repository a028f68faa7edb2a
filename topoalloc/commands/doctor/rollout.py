"""`install --wait` and `upgrade --wait`: the workloads just applied rolled out (as `kubectl rollout
status` judges a Deployment and a DaemonSet), then doctor until no check fails or the time is up.
A fresh installation needs a moment after its pods are ready (a leader elected, Devices published,
the caBundle set), so doctor is asked again while something fails, and its last report is printed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from topoalloc.commands.doctor.facts import JSON, meta
from topoalloc.errors import Failure

WORKLOADS = ("Deployment", "DaemonSet")
POLL = 2.0


def pending(obj: JSON) -> str:
    """What a Deployment or DaemonSet still waits for ("" once it has rolled out)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if int(status.get("observedGeneration") or 0) < int(meta(obj).get("generation") or 0):
        return "its controller has not seen the new spec yet"
    if obj.get("kind") == "DaemonSet":
        wanted = int(status.get("desiredNumberScheduled") or 0)
        updated = int(status.get("updatedNumberScheduled") or 0)
        available = int(status.get("numberAvailable") or 0)
        if updated < wanted:
            return f"{updated} of {wanted} pods updated"
        if available < wanted:
            return f"{available} of {wanted} updated pods available"
        return ""
    wanted = int(spec.get("replicas", 1))
    updated = int(status.get("updatedReplicas") or 0)
    replicas = int(status.get("replicas") or 0)
    available = int(status.get("availableReplicas") or 0)
    if updated < wanted:
        return f"{updated} of {wanted} replicas updated"
    if replicas > updated:
        return f"{replicas - updated} old replica(s) still terminating"
    if available < updated:
        return f"{available} of {updated} updated replicas available"
    return ""


def wait_rollout(
    cluster: Any,
    docs: Iterable[JSON],
    timeout: float,
    say: Callable[[str], None],
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Wait until every Deployment and DaemonSet of `docs` rolled out; the time left. Raises
    Failure naming what had not when `timeout` passes."""
    deadline = clock() + timeout
    workloads = [d for d in docs if d.get("kind") in WORKLOADS]
    said: dict[str, str] = {}
    while True:
        left = {}
        for doc in workloads:
            name = f"{doc['kind']} {doc['metadata'].get('namespace', '')}/{doc['metadata']['name']}"
            found = cluster.get(cluster.doc_path(doc))
            why = "not there" if found is None else pending(found)
            if why:
                left[name] = why
                if said.get(name) != why:
                    say(f"waiting for {name}: {why}")
            elif said.get(name):
                say(f"{name} rolled out")
            said[name] = why
        if not left:
            return max(0.0, deadline - clock())
        if clock() >= deadline:
            what = "; ".join(f"{n}: {w}" for n, w in left.items())
            raise Failure("rollout", f"{timeout:.0f} s", f"not done: {what}")
        sleep(POLL)


def settle(
    look: Callable[[], tuple[Any, list[Any]]],
    seconds: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Any, list[Any]]:
    """Doctor's look, again while a check fails and `seconds` last; the last look."""
    from topoalloc.commands.doctor.findings import Summary

    deadline = clock() + seconds
    while True:
        facts, findings = look()
        if Summary.of(findings).healthy or clock() >= deadline:
            return facts, findings
        sleep(POLL)


def wait_and_check(
    cluster: Any, docs: list[JSON], root: Path, timeout: float, kubeadm_dir: Path, say: Callable[[str], None]
) -> tuple[Any, list[Any]]:
    """The rollout, then doctor (its default thresholds and probes), within `timeout` in all."""
    from topoalloc.commands.doctor.command import diagnose

    left = wait_rollout(cluster, docs, timeout, say)
    say("rolled out; topoalloc doctor:")
    return settle(lambda: diagnose(cluster, root, {"kubeadm_dir": kubeadm_dir}), left)
