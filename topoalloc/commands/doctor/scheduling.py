"""Scheduler wiring of the install mode. Placement: the placement webhook is there and the allocator
places (no `--no-placement`). Secondary: the second kube-scheduler runs and its configuration's
extender is the allocator's Service. Kubeadm: the configuration copied to the control-plane nodes
(`--scheduler-config`, or the file `install --mode kubeadm` wrote) names the allocator Service's
ClusterIP, and the cluster's kube-scheduler pods, where they are visible, run with it. In any mode
a configuration naming an extender that is not there is a failure: with `ignorable: false` every pod
asking for a device it manages fails to schedule; so is, once topoalloc is uninstalled, a
kube-scheduler still started with the configuration `install --mode kubeadm` had copied."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from topoalloc.commands.doctor.facts import (
    ALLOCATOR,
    JSON,
    NAMESPACE,
    NOT_INSTALLED,
    PLACEMENT_WEBHOOK,
    SCHEDULER,
    WEBHOOK_CONFIGURATION,
    Facts,
    SchedulerConfig,
    meta,
)
from topoalloc.commands.doctor.findings import Finding, fail, ok, warn
from topoalloc.commands.installer.kubeadm import CONFIG, HOST_DIR, wired_schedulers

CHECK = "scheduler"
NO_PLACEMENT = "--no-placement"


def _args(facts: Facts) -> list[str]:
    spec = ((facts.deployments.get(ALLOCATOR) or {}).get("spec") or {}).get("template") or {}
    containers = (spec.get("spec") or {}).get("containers") or []
    return [str(a) for a in (containers[0].get("args") or [])] if containers else []


def check_placement(facts: Facts) -> list[Finding]:
    out = []
    hooks = {h.get("name") for h in (facts.webhooks or {}).get("webhooks") or []}
    if facts.webhooks is not None and PLACEMENT_WEBHOOK not in hooks:
        out.append(
            fail(
                CHECK,
                f"placement mode, but {WEBHOOK_CONFIGURATION} has no {PLACEMENT_WEBHOOK}: GPU pods "
                "are not gated at admission, so kube-scheduler binds them by count",
                "topoalloc install (it applies the placement webhook again)",
            )
        )
    placement = facts.allocator_config().get("placement") or {}
    if NO_PLACEMENT in _args(facts) or placement.get("enabled") is False:
        out.append(
            fail(
                CHECK,
                "placement mode, but the allocator runs without placement: nothing removes the "
                "topoalloc.io/placement gate, every GPU pod waits",
                "topoalloc install",
            )
        )
    if not out:
        out.append(
            ok(
                CHECK,
                "placement mode: GPU pods are gated at admission, placed by the allocator and bound "
                "by the cluster's own kube-scheduler (nothing of it configured)",
            )
        )
    return out


def _service_at(facts: Facts, host: str) -> tuple[JSON | None, str]:
    """The Service an extender URL's host names (None and why not, "" when it cannot be told)."""
    for service in facts.services:
        spec = service.get("spec") or {}
        if host and (host == spec.get("clusterIP") or host in (spec.get("clusterIPs") or [])):
            return service, ""
    parts = host.split(".")
    if len(parts) >= 2 and (len(parts) == 2 or parts[2] == "svc"):
        name, namespace = parts[0], parts[1]
        found = next(
            (
                s
                for s in facts.services
                if (meta(s).get("name"), meta(s).get("namespace")) == (name, namespace)
            ),
            None,
        )
        return found, f"Service {namespace}/{name} does not exist"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None, ""  # a name outside the cluster's DNS
    if address.is_loopback:
        return None, ""  # kube-scheduler beside the allocator, or a tunnel to it
    return None, f"no Service of this cluster has the ClusterIP {host}"


def _backends(facts: Facts, service: JSON) -> list[str]:
    selector = (service.get("spec") or {}).get("selector") or {}
    namespace = meta(service).get("namespace")
    return sorted(
        str(meta(p).get("name"))
        for p in facts.pods
        if meta(p).get("namespace") == namespace
        and not meta(p).get("deletionTimestamp")
        and selector
        and all((meta(p).get("labels") or {}).get(k) == v for k, v in selector.items())
    )


def check_extenders(facts: Facts, config: SchedulerConfig, fix: str) -> list[Finding]:
    data, why = config.parsed()
    if data is None:
        return [fail(CHECK, f"kube-scheduler configuration ({config.source}) does not read: {why}", fix)]
    extenders = [e for e in data.get("extenders") or [] if isinstance(e, dict)]
    if not extenders:
        return [
            fail(
                CHECK,
                f"kube-scheduler configuration ({config.source}) names no extender: kube-scheduler "
                "never calls the allocator",
                fix,
            )
        ]
    out = []
    for extender in extenders:
        url = str(extender.get("urlPrefix", ""))
        parsed = urlsplit(url)
        host = parsed.hostname or ""
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        stuck = (
            "every pod asking for a device it manages fails to schedule"
            if extender.get("ignorable") is not True
            else "pods are scheduled without it (ignorable)"
        )
        service, why = _service_at(facts, host)
        if service is None and not why:
            out.append(
                warn(
                    CHECK,
                    f"kube-scheduler's extender {url} ({config.source}): not a Service address, so "
                    "doctor cannot tell whether it reaches the allocator",
                    f"use the allocator Service's ClusterIP or DNS name ({ALLOCATOR}.{NAMESPACE}.svc)",
                )
            )
            continue
        if service is None:
            out.append(
                fail(
                    CHECK,
                    f"kube-scheduler's extender {url} ({config.source}) is missing: {why}; {stuck}",
                    fix,
                )
            )
            continue
        ports = [p.get("port") for p in (service.get("spec") or {}).get("ports") or []]
        name = f"{meta(service).get('namespace')}/{meta(service).get('name')}"
        if port not in ports:
            out.append(
                fail(
                    CHECK,
                    f"kube-scheduler's extender {url} ({config.source}): Service {name} has no port "
                    f"{port} (it has {', '.join(map(str, ports)) or 'none'}); {stuck}",
                    fix,
                )
            )
        elif name != f"{NAMESPACE}/{ALLOCATOR}":
            out.append(
                warn(
                    CHECK,
                    f"kube-scheduler's extender {url} ({config.source}) is Service {name}, not the "
                    "allocator's",
                    fix,
                )
            )
        elif not _backends(facts, service):
            out.append(
                fail(
                    CHECK,
                    f"kube-scheduler's extender {url} ({config.source}): Service {name} selects no "
                    f"pod (no allocator leads, or none labelled topoalloc.io/leader=true); {stuck}",
                    f"see the allocator findings; kubectl -n {NAMESPACE} get pods -l "
                    "topoalloc.io/leader=true",
                )
            )
        else:
            out.append(
                ok(
                    CHECK,
                    f"kube-scheduler's extender {url} ({config.source}) is the allocator's Service, "
                    f"serving {', '.join(_backends(facts, service))}",
                )
            )
    return out


def check_secondary(facts: Facts) -> list[Finding]:
    deployment = facts.deployments.get(SCHEDULER)
    if deployment is None:
        return [
            fail(
                CHECK,
                f"secondary mode, but no Deployment {NAMESPACE}/{SCHEDULER}: pods naming it are never "
                "scheduled",
                "topoalloc install --mode secondary",
            )
        ]
    out = []
    if not int((deployment.get("status") or {}).get("readyReplicas") or 0):
        out.append(
            fail(
                CHECK,
                f"no replica of {NAMESPACE}/{SCHEDULER} is ready: pods naming it wait",
                f"kubectl -n {NAMESPACE} describe pods -l app.kubernetes.io/name={SCHEDULER}",
            )
        )
    text = ((facts.configmaps.get(SCHEDULER) or {}).get("data") or {}).get("config.yaml")
    if not isinstance(text, str):
        return [
            *out,
            fail(CHECK, f"no ConfigMap {NAMESPACE}/{SCHEDULER} with config.yaml", "topoalloc install"),
        ]
    config = SchedulerConfig(f"ConfigMap {NAMESPACE}/{SCHEDULER}", text)
    return out + check_extenders(
        facts, config, "topoalloc install --mode secondary (it writes the ConfigMap again)"
    )


def check_kubeadm(facts: Facts) -> list[Finding]:
    out = []
    if ALLOCATOR in facts.deployments and NO_PLACEMENT not in _args(facts):
        out.append(
            warn(
                CHECK,
                "kubeadm mode, but the allocator runs with placement on as well",
                "topoalloc install --mode kubeadm",
            )
        )
    wanted = f"--config={HOST_DIR}/{CONFIG}"
    schedulers = [
        p
        for p in facts.pods
        if meta(p).get("namespace") == "kube-system"
        and (meta(p).get("labels") or {}).get("component") == "kube-scheduler"
    ]
    for pod in schedulers:
        command = [
            str(a) for c in (pod.get("spec") or {}).get("containers") or [] for a in (c.get("command") or [])
        ]
        if wanted not in command:
            out.append(
                fail(
                    CHECK,
                    f"kube-scheduler {meta(pod).get('name')} runs without {wanted}: it never calls "
                    "the allocator",
                    f"kubeadm upgrade node --patches {HOST_DIR}/patches on that node",
                )
            )
    return out


def leftover_placement(facts: Facts, mode: str) -> list[Finding]:
    hooks = {h.get("name") for h in (facts.webhooks or {}).get("webhooks") or []}
    if PLACEMENT_WEBHOOK not in hooks:
        return []
    return [
        fail(
            CHECK,
            f"{mode} mode, but {WEBHOOK_CONFIGURATION} still has {PLACEMENT_WEBHOOK}: it gates GPU pods "
            "that an allocator without placement never ungates",
            f"topoalloc install --mode {mode} (it removes the placement webhook)",
        )
    ]


def check(facts: Facts) -> list[Finding]:
    mode, _ = facts.mode()
    if mode == NOT_INSTALLED:
        return left_wired(facts)  # the allocator, webhook and agent findings say what is missing
    if mode == "placement":
        out = check_placement(facts)
    elif mode == "secondary":
        out = leftover_placement(facts, mode) + check_secondary(facts)
    else:
        out = leftover_placement(facts, mode) + check_kubeadm(facts)
    fix = (
        f"topoalloc install --mode kubeadm writes it anew with the allocator Service's ClusterIP; copy it to "
        f"{HOST_DIR}/ on every control-plane node"
    )
    for config in facts.scheduler_configs:
        out += check_extenders(facts, config, fix)
    if mode == "kubeadm" and not facts.scheduler_configs:
        out.append(
            warn(
                CHECK,
                "kubeadm mode: kube-scheduler's configuration lives on the control-plane nodes, out "
                "of the API's sight",
                f"pass --scheduler-config FILE (the file copied to {HOST_DIR}/)",
            )
        )
    return out


def left_wired(facts: Facts) -> list[Finding]:
    """Nothing of topoalloc installed, but kube-scheduler still calls the allocator: a kubeadm
    control plane still started with the copied configuration, or the configuration given."""
    undo = (
        f"on that control-plane node remove --config={HOST_DIR}/{CONFIG} and the topoalloc volume from "
        "/etc/kubernetes/manifests/kube-scheduler.yaml (topoalloc uninstall prints every step), or "
        "topoalloc install --mode kubeadm"
    )
    out = [
        fail(
            CHECK,
            f"kube-scheduler {name} runs with topoalloc's configuration ({HOST_DIR}/{CONFIG}: an extender "
            "with ignorable: false) but no allocator is installed: every pod asking for a GPU or RDMA "
            "device fails to schedule",
            undo,
        )
        for name in wired_schedulers(facts.pods)
    ]
    fix = "remove that extender from the configuration and restart kube-scheduler, or topoalloc install"
    for config in facts.scheduler_configs:
        out += check_extenders(facts, config, fix)
    return out
