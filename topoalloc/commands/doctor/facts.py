"""The cluster as doctor read it, once: the objects every check looks at (plain JSON as the API
server returned them), what could not be read and why, and the admission probes' answers.

Built by fetch.py from a live cluster, and by the tests from constructed objects."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from apis.timestamps import parse_time
from topoalloc.commands.explain.waits import event_time

JSON = dict[str, Any]
NAMESPACE = "topoalloc-system"
ALLOCATOR = "topoalloc-allocator"
SCHEDULER = "topoalloc-scheduler"
AGENT = "topoalloc-agent"
WEBHOOK_CONFIGURATION = "topoalloc-gang"
SERVER_SECRET = "topoalloc-allocator-tls"
NAME_LABEL = "app.kubernetes.io/name"
PLACEMENT_WEBHOOK = "placement.topoalloc.io"
NOT_INSTALLED = "no"  # Facts.mode() where nothing of topoalloc is there


@dataclass(frozen=True)
class Probe:
    """One server-side dry-run create of a pod a webhook selects: what came back."""

    webhook: str  # the webhook whose answer it shows
    wanted: str  # what its answer adds: a scheduling gate's name, or "affinity"
    admitted: JSON | None = None  # the pod as the API server would store it
    refused: str = ""  # the API server's refusal (a webhook failing closed says why here)


@dataclass(frozen=True)
class SchedulerConfig:
    """A KubeSchedulerConfiguration doctor was given or found, and where it came from."""

    source: str  # "ConfigMap topoalloc-system/topoalloc-scheduler", "file topoalloc-kubeadm/..."
    text: str

    def parsed(self) -> tuple[JSON | None, str]:
        """The configuration, or None and why it does not read."""
        try:
            data = yaml.safe_load(self.text)
        except yaml.YAMLError as exc:
            return None, " ".join(str(exc).split())
        if not isinstance(data, dict):
            return None, "not a mapping"
        return data, ""


@dataclass
class Facts:
    now: float  # the API server's clock when it said (its Date header), else this machine's
    local_now: float
    server_now: float | None = None
    host: str = ""
    server_version: str = ""
    record: Mapping[str, str] | None = None  # ConfigMap topoalloc-install's data (None: none)
    crds: dict[str, JSON] = field(default_factory=dict)  # name -> CRD as served (absent: none)
    wanted_crds: dict[str, JSON] = field(default_factory=dict)  # name -> deploy/crds's
    deployments: dict[str, JSON] = field(default_factory=dict)  # topoalloc-system's, by name
    daemonsets: list[JSON] = field(default_factory=list)  # every namespace's
    pods: list[JSON] = field(default_factory=list)  # every namespace's
    nodes: list[JSON] = field(default_factory=list)
    devices: list[JSON] = field(default_factory=list)
    slices: list[JSON] = field(default_factory=list)  # ResourceSlices (none where DRA is not served)
    claims: list[JSON] = field(default_factory=list)  # ResourceClaims
    leases: dict[str, JSON] = field(default_factory=dict)  # topoalloc-system's, by name
    configmaps: dict[str, JSON] = field(default_factory=dict)  # topoalloc-system's, by name
    secrets: dict[str, JSON] = field(default_factory=dict)  # topoalloc-system's TLS Secrets
    services: list[JSON] = field(default_factory=list)  # every namespace's
    webhooks: JSON | None = None  # the MutatingWebhookConfiguration topoalloc-gang
    gang_objects: dict[str, JSON] = field(default_factory=dict)  # "kind NS/NAME" -> object
    events: list[JSON] = field(default_factory=list)  # Events of the pods doctor names
    probes: list[Probe] = field(default_factory=list)
    probe_note: str = ""  # why no probe ran ("" when they ran)
    scheduler_configs: list[SchedulerConfig] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)  # what -> why it could not be read

    # -- lookups the checks share ------------------------------------------------------------------

    def pods_of(self, app: str, namespace: str = NAMESPACE) -> list[JSON]:
        """The live (not terminating) pods of one of the installed workloads."""
        return [
            p
            for p in self.pods
            if meta(p).get("namespace") == namespace
            and (meta(p).get("labels") or {}).get(NAME_LABEL) == app
            and not meta(p).get("deletionTimestamp")
        ]

    def daemonset(self, name: str, namespace: str = NAMESPACE) -> JSON | None:
        return next((d for d in self.daemonsets if (name, namespace) == key_of(d)), None)

    def allocator_config(self) -> JSON:
        """The allocator's config file as installed (ConfigMap topoalloc-allocator), {} if none."""
        return _config_file(self.configmaps.get(ALLOCATOR), "allocator.yaml")

    def agent_config(self) -> JSON:
        """The agents' config file as installed (ConfigMap topoalloc-agent), {} if none."""
        return _config_file(self.configmaps.get(AGENT), "agent.yaml")

    def mode(self) -> tuple[str, str]:
        """(the install mode, how doctor knows it): the installer's record, else what is there."""
        if self.record and self.record.get("mode"):
            return str(self.record["mode"]), f"recorded in ConfigMap {NAMESPACE}/topoalloc-install"
        hooks = [h.get("name") for h in (self.webhooks or {}).get("webhooks") or []]
        if PLACEMENT_WEBHOOK in hooks:
            return "placement", "no install record; the placement webhook is there"
        if SCHEDULER in self.deployments:
            return "secondary", f"no install record; Deployment {NAMESPACE}/{SCHEDULER} is there"
        if ALLOCATOR not in self.deployments and self.webhooks is None:
            return NOT_INSTALLED, f"no install record in {NAMESPACE}, no allocator, no webhooks"
        return "kubeadm", "no install record, no placement webhook, no second scheduler"

    def node(self, name: str) -> JSON | None:
        return next((n for n in self.nodes if meta(n).get("name") == name), None)

    def events_of(self, obj: JSON) -> list[JSON]:
        """The Events about `obj` (matched by uid, else kind and name), oldest first."""
        m = meta(obj)
        uid, name, namespace = m.get("uid"), m.get("name"), m.get("namespace", "")
        out = []
        for event in self.events:
            about = event.get("involvedObject") or event.get("regarding") or {}
            if uid and about.get("uid"):
                if about.get("uid") == uid:
                    out.append(event)
            elif about.get("name") == name and about.get("namespace", "") == namespace:
                out.append(event)
        return sorted(out, key=event_time)


def meta(obj: Mapping[str, Any] | None) -> JSON:
    found = (obj or {}).get("metadata")
    return found if isinstance(found, dict) else {}


def key_of(obj: JSON) -> tuple[str, str]:
    m = meta(obj)
    return str(m.get("name", "")), str(m.get("namespace", ""))


def ref(obj: JSON) -> str:
    name, namespace = key_of(obj)
    return f"{namespace}/{name}" if namespace else name


def created(obj: JSON) -> float | None:
    return parse_time(meta(obj).get("creationTimestamp"))


def _config_file(configmap: JSON | None, key: str) -> JSON:
    text = ((configmap or {}).get("data") or {}).get(key)
    if not isinstance(text, str):
        return {}
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def names(objs: Iterable[JSON]) -> list[str]:
    return sorted(str(meta(o).get("name", "")) for o in objs)


def ready(pod: JSON) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_state(pod: JSON) -> str:
    """A pod's state as `kubectl get pods` would say it: its node, phase, readiness, and the
    reason a container waits or a scheduler refused it."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    where = f"on {spec['nodeName']}" if spec.get("nodeName") else "not bound"
    state = str(status.get("phase") or "Pending")
    for c in status.get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            state = str(waiting["reason"])
        if c.get("restartCount"):
            state += f", {c['restartCount']} restarts"
    if not spec.get("nodeName"):
        scheduled = [
            c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled" and c.get("message")
        ]
        if scheduled:
            state += f": {scheduled[0]['message']}"
    return f"{ref(pod)} {where}, {state}{', ready' if ready(pod) else ', not ready'}"
