"""The allocator: its Deployment's replicas ready, one leader holding a Lease it keeps renewing, the
leader's pod labelled for the extender's Service; and the clocks doctor judges ages by."""

from __future__ import annotations

from apis.timestamps import parse_time
from topoalloc.commands.doctor.facts import ALLOCATOR, JSON, NAMESPACE, Facts, meta, pod_state
from topoalloc.commands.doctor.findings import Finding, fail, ok, warn
from topoalloc.output import ago

CHECK = "allocator"
LEADER_LABEL = "topoalloc.io/leader"
LOGS = f"kubectl -n {NAMESPACE} logs -l app.kubernetes.io/name={ALLOCATOR} --tail 50"


def check_replicas(facts: Facts) -> Finding:
    deployment = facts.deployments.get(ALLOCATOR)
    if deployment is None:
        return fail(
            CHECK,
            f"no Deployment {NAMESPACE}/{ALLOCATOR}: nothing places GPU pods or answers the webhooks",
            "topoalloc install",
        )
    wanted = int((deployment.get("spec") or {}).get("replicas", 1))
    status = deployment.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    pods = [pod_state(p) for p in facts.pods_of(ALLOCATOR)]
    if wanted == 0:
        return fail(
            CHECK,
            f"Deployment {NAMESPACE}/{ALLOCATOR} is scaled to 0 replicas: no allocator places GPU pods, "
            "removes their gates or answers the admission webhooks (gang members are refused)",
            f"kubectl -n {NAMESPACE} scale deployment {ALLOCATOR} --replicas=2",
            pods,
        )
    if ready == 0:
        return fail(
            CHECK,
            f"none of the allocator's {wanted} replicas is ready (ready: watch cache synced)",
            f"kubectl -n {NAMESPACE} describe pods -l app.kubernetes.io/name={ALLOCATOR}; {LOGS}",
            pods,
        )
    if ready < wanted:
        return warn(
            CHECK,
            f"{ready} of the allocator's {wanted} replicas ready: no hot standby to take over",
            f"kubectl -n {NAMESPACE} describe pods -l app.kubernetes.io/name={ALLOCATOR}",
            pods,
        )
    return ok(CHECK, f"{ready} of {wanted} allocator replicas ready", pods)


def lease_name(facts: Facts) -> str:
    election = facts.allocator_config().get("leaderElection") or {}
    name = election.get("leaseName") or election.get("lease_name")
    return str(name) if name else ALLOCATOR


def check_leader(facts: Facts, skew: float) -> list[Finding]:
    name = lease_name(facts)
    lease: JSON | None = facts.leases.get(name)
    if lease is None:
        return [
            fail(
                CHECK,
                f"no Lease {NAMESPACE}/{name}: no allocator has led yet",
                f"check that the allocator pods run: {LOGS}",
            )
        ]
    spec = lease.get("spec") or {}
    holder = str(spec.get("holderIdentity") or "")
    duration = float(spec.get("leaseDurationSeconds") or 15)
    renewed = parse_time(spec.get("renewTime"))
    if not holder or renewed is None:
        return [
            fail(
                CHECK,
                f"Lease {NAMESPACE}/{name} is held by no one: no leader",
                f"check the allocator pods: {LOGS}",
            )
        ]
    age = facts.now - renewed
    if age > duration:
        return [
            fail(
                CHECK,
                f"no leader: {holder} last renewed Lease {NAMESPACE}/{name} {ago(age)} ago ({duration:.0f} s "
                "lease); nothing places pods, removes gates or keeps the webhooks' caBundle",
                f"check the allocator pods: {LOGS}",
            )
        ]
    out = []
    if age < -skew:
        out.append(
            warn(
                "clock",
                f"Lease {NAMESPACE}/{name} was renewed {ago(-age)} in the future of the API server's clock: "
                f"the clock of {holder}'s node runs ahead",
                "keep the nodes' clocks in step (chrony, systemd-timesyncd)",
            )
        )
    live = {meta(p).get("name") for p in facts.pods_of(ALLOCATOR)}
    labelled = sorted(
        str(meta(p).get("name"))
        for p in facts.pods_of(ALLOCATOR)
        if (meta(p).get("labels") or {}).get(LEADER_LABEL) == "true"
    )
    if holder not in live:
        out.append(
            warn(
                CHECK,
                f"the leader {holder} is not a live pod of Deployment {NAMESPACE}/{ALLOCATOR}",
                "another allocator (an old install, a test) holds the Lease; stop it",
            )
        )
    elif labelled != [holder]:
        extender = facts.mode()[0] != "placement"
        said = ", ".join(labelled) or "no pod"
        what = (
            f"the leader {holder} is not the one pod labelled {LEADER_LABEL}=true ({said} is): the "
            "extender's "
            f"Service {NAMESPACE}/{ALLOCATOR} reaches {'no leader' if not labelled else 'the wrong pods'}"
        )
        fix = f"the leader relabels its pod within seconds; if it stays: {LOGS}"
        out.append(fail(CHECK, what, fix) if extender else warn(CHECK, what, fix))
    out.append(ok(CHECK, f"leader {holder}: Lease renewed {ago(max(age, 0))} ago ({duration:.0f} s lease)"))
    return out


def check_clock(facts: Facts, skew: float) -> Finding:
    if facts.server_now is None:
        return warn(
            "clock",
            "the API server did not say its time: ages are judged by this machine's clock",
            "nothing to do unless the ages below look wrong",
        )
    drift = facts.local_now - facts.server_now
    if abs(drift) > skew:
        side = "ahead of" if drift > 0 else "behind"
        return warn(
            "clock",
            f"this machine's clock is {ago(abs(drift))} {side} the API server's; doctor judges ages by the "
            "server's",
            "keep this machine's clock in step (chrony, systemd-timesyncd)",
        )
    return ok("clock", f"this machine's clock agrees with the API server's (within {skew:.0f} s)")


def check(facts: Facts, skew: float) -> list[Finding]:
    replicas = check_replicas(facts)
    out = [replicas]
    if facts.deployments.get(ALLOCATOR) is not None:
        out += check_leader(facts, skew)
    return [*out, check_clock(facts, skew)]
