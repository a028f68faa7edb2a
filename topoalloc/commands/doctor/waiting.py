"""Pods that wait too long: gated by topoalloc (and why, from their condition and Events; a failure
when nothing would remove the gate: no leader, or the component that owns it turned off), GPU pods
kube-scheduler has not bound, and pods whose claims topoalloc allocated that kubelet never
prepared."""

from __future__ import annotations

from apis import dra
from apis import resources as rn
from apis.timestamps import parse_time
from topoalloc.commands.doctor.allocator import lease_name
from topoalloc.commands.doctor.facts import ALLOCATOR, JSON, NAMESPACE, Facts, meta, ref
from topoalloc.commands.doctor.findings import Finding, fail, ok, warn
from topoalloc.commands.explain.waits import GATES, Wait, waits
from topoalloc.output import ago

COMPONENTS = {"placement": "placement", "gang": "gang", "dra": "dra"}  # owner -> allocator config block


def asks_for_devices(pod: JSON) -> bool:
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        return True
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = (c or {}).get("resources") or {}
        if any(
            k in rn.RESOURCE_DEVICE_TYPE for part in ("requests", "limits") for k in (res.get(part) or {})
        ):
            return True
    return False


def long_waits(pod: JSON, events: list[JSON], now: float, after: float) -> list[Wait]:
    """The pod's waits older than `after` that doctor names: topoalloc's gates, a device pod not
    bound, a bound pod with claims that does not start."""
    out = []
    for w in waits(pod, events):
        if w.since is None or now - w.since <= after:
            continue
        if (
            w.what in GATES
            or (w.what == "scheduling" and asks_for_devices(pod))
            or (w.what == "starting" and (pod.get("spec") or {}).get("resourceClaims"))
        ):
            out.append(w)
    return out


def stuck(pods: list[JSON], now: float, after: float) -> list[JSON]:
    """The pods whose Events doctor reads (by what the pods alone say)."""
    return [p for p in pods if long_waits(p, [], now, after)]


def leading(facts: Facts) -> bool:
    spec = (facts.leases.get(lease_name(facts)) or {}).get("spec") or {}
    renewed = parse_time(spec.get("renewTime"))
    duration = float(spec.get("leaseDurationSeconds") or 15)
    return bool(spec.get("holderIdentity")) and renewed is not None and facts.now - renewed <= duration


def _stopped(facts: Facts, owner: str) -> str:
    """Why nothing removes `owner`'s gate ("" when something does)."""
    if not leading(facts):
        return "no allocator leads, so nothing removes it"
    block = COMPONENTS.get(owner)
    if block and (facts.allocator_config().get(block) or {}).get("enabled") is False:
        return f"the allocator's {block} is turned off ({block}.enabled: false), so nothing removes it"
    return ""


def check_pods(facts: Facts, after: float) -> list[Finding]:
    gated: list[str] = []
    unbound: list[str] = []
    stopped: set[str] = set()
    for pod in facts.pods:
        for w in long_waits(pod, facts.events_of(pod), facts.now, after):
            if w.what in GATES:
                why = _stopped(facts, w.owner)
                if why:
                    stopped.add(f"{w.what}: {why}")
                gated.append(
                    f"{ref(pod)}: gate {w.what} for {ago(facts.now - (w.since or facts.now))}: {w.why}"
                )
            elif w.what == "scheduling":
                unbound.append(
                    f"{ref(pod)}: not bound for {ago(facts.now - (w.since or facts.now))}: {w.why}"
                )
    out = []
    if gated and stopped:
        out.append(
            fail(
                "pods",
                f"{len(gated)} pod(s) gated by topoalloc longer than {ago(after)}; "
                + "; ".join(sorted(stopped)),
                f"see the allocator findings; kubectl -n {NAMESPACE} logs -l "
                f"app.kubernetes.io/name={ALLOCATOR}",
                gated,
            )
        )
    elif gated:
        out.append(
            warn(
                "pods",
                f"{len(gated)} pod(s) gated by topoalloc longer than {ago(after)} (why, below)",
                "each waits for what its line says (room, the rest of its gang, its claims); "
                "topoalloc explain pod NS/NAME tells one pod's story",
                gated,
            )
        )
    if unbound:
        out.append(
            warn(
                "pods",
                f"{len(unbound)} pod(s) asking for devices not bound after {ago(after)}",
                "kube-scheduler's word on each is below; topoalloc explain pod NS/NAME",
                unbound,
            )
        )
    if not out:
        out.append(ok("pods", f"no pod gated by topoalloc or waiting to be bound longer than {ago(after)}"))
    return out


def _ours(claim: JSON) -> bool:
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or []
    return any(r.get("driver") == dra.DRIVER for r in results)


def check_claims(facts: Facts, after: float) -> list[Finding]:
    pods = {(meta(p).get("namespace"), meta(p).get("name")): p for p in facts.pods}
    never = []
    for claim in facts.claims:
        if not _ours(claim):
            continue
        namespace = meta(claim).get("namespace")
        for user in (claim.get("status") or {}).get("reservedFor") or []:
            pod = pods.get((namespace, user.get("name")))
            if pod is None:
                continue
            for w in long_waits(pod, facts.events_of(pod), facts.now, after):
                if w.what == "starting":
                    node = (pod.get("spec") or {}).get("nodeName")
                    said = f": {w.why}" if w.why else ""
                    never.append(
                        f"claim {ref(claim)}: pod {ref(pod)} bound to {node} "
                        f"{ago(facts.now - (w.since or facts.now))} ago, not started{said}"
                    )
    if never:
        return [
            fail(
                "claims",
                f"{len(never)} claim(s) allocated by topoalloc whose pod never started: kubelet "
                "did not prepare them",
                f"the agent on that node serves kubelet's DRA plugin (mode: dra): kubectl -n {NAMESPACE} "
                "logs "
                "-l app.kubernetes.io/name=topoalloc-agent; kubectl describe pod NAME",
                never,
            )
        ]
    count = sum(1 for c in facts.claims if _ours(c))
    return [ok("claims", f"{count} claim(s) allocated by topoalloc, none left unprepared past {ago(after)}")]


def check(facts: Facts, gated_after: float, prepare_after: float) -> list[Finding]:
    return check_pods(facts, gated_after) + check_claims(facts, prepare_after)
