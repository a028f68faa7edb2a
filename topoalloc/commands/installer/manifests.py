"""What `topoalloc install` applies: the kustomize bases rendered for the options and the cluster.

* `placement` mode (the default): deploy (CRDs, allocator placing every GPU pod at admission; the
  cluster's own kube-scheduler binds, nothing of it configured); `secondary` mode:
  deploy/secondary-scheduler (CRDs, allocator, a second kube-scheduler calling the extender, pinned
  to the server's exact version); `kubeadm` mode: deploy/extender (CRDs, allocator; the cluster's own
  kube-scheduler gets the extender block, kubeadm.py). All add daemonset/ (the node agent).
* the topoalloc image and version, the gang webhook's failurePolicy, certificates generated into
  the two TLS Secrets (and the webhook's caBundle) or issued by cert-manager.
* every object labelled `app.kubernetes.io/managed-by: topoalloc`, which is how uninstall and
  prune find what the installer made; objects that exist without that label (a CRD Koordinator or
  scheduler-plugins installed, a namespace someone else made) are left out, so never changed and
  never deleted.
* with `monitoring`, deploy/components/monitoring: the Prometheus Operator's ServiceMonitor,
  PodMonitor and PrometheusRule and the Grafana dashboard's ConfigMap (docs/monitoring.md).
* deploy/dra's DeviceClasses where the server serves resource.k8s.io/v1 (unless
  `deviceClasses: false`); the chart's values (--values, --set: settings, agent pools), settings.py.
* a ConfigMap `topoalloc-install` recording the options, which `upgrade` starts from.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import topoalloc
from allocator.runtime.admission_settings import WEBHOOK_CONFIGURATION
from allocator.runtime.config import DEFAULT_NAMESPACE
from topoalloc.commands.certs import secret_manifest
from topoalloc.commands.installer.kustomize import Doc, Image, build, ident
from topoalloc.commands.installer.settings import apply_settings
from topoalloc.commands.installer.tls import TlsFiles

NAMESPACE = DEFAULT_NAMESPACE
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "topoalloc"
PART_OF = "app.kubernetes.io/part-of"
RECORD = "topoalloc-install"
#: The label the installer puts on GPU nodes that carry neither GPU Feature Discovery's nor Node
#: Feature Discovery's label; daemonset/daemonset.yaml's node affinity accepts it too.
GPU_NODE_LABEL = "topoalloc.io/gpu-node"
SCHEDULER = "topoalloc-scheduler"
MODES = ("placement", "secondary", "kubeadm")
# What the monitoring component creates: the Prometheus Operator's kinds.
MONITORING_API = "monitoring.coreos.com/v1"
MONITORING_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
BASES = {"placement": "", "secondary": "secondary-scheduler", "kubeadm": "extender"}
CERTS = ("generate", "cert-manager")
FAILURE_POLICIES = ("Ignore", "Fail")
# The gang webhooks of deploy/allocator/webhook.yaml (each selects members only: a label, or a
# Koordinator gang's annotation or a native gang's pod field).
GANG_WEBHOOKS = (
    "podgroup.gang.topoalloc.io",
    "legacy-podgroup.gang.topoalloc.io",
    "koordinator-label.gang.topoalloc.io",
    "unlabelled.gang.topoalloc.io",
)
# Apply order: what others refer to first, the admission webhook last (kustomize's order).
KIND_ORDER = (
    "Namespace",
    "CustomResourceDefinition",
    "ServiceAccount",
    "ClusterRole",
    "Role",
    "ClusterRoleBinding",
    "RoleBinding",
    "ConfigMap",
    "Secret",
    "Service",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "DeviceClass",
    "Issuer",
    "Certificate",
    "Deployment",
    "DaemonSet",
    "PodDisruptionBudget",
    "MutatingWebhookConfiguration",
)


@dataclass(frozen=True)
class InstallOptions:
    """The choices of one installation (recorded in the cluster for `upgrade`)."""

    version: str
    image: str = "topoalloc"
    mode: str = "placement"
    certs: str = "generate"
    gang_failure_policy: str = ""  # "": the mode's (Fail in placement mode, Ignore with an extender)
    nvidia_runtime_class: bool = False
    monitoring: bool = False  # deploy/components/monitoring (needs monitoring.coreos.com/v1)
    scheduler_version: str = ""  # secondary mode: vX.Y.Z; set from the server's /version
    scheduler_image: str = "registry.k8s.io/kube-scheduler"
    device_classes: bool = True  # deploy/dra, where the server serves resource.k8s.io/v1
    # The chart's values given with --values/--set (JSON): the settings and agent pools
    # (settings.py); recorded, so that `upgrade` keeps them.
    values: str = ""

    def settings(self) -> dict[str, Any]:
        return json.loads(self.values) if self.values else {}

    def record(self) -> dict[str, str]:
        out = {}
        for key, value in asdict(self).items():
            out[_camel(key)] = ("true" if value else "false") if isinstance(value, bool) else str(value)
        return out

    @classmethod
    def from_record(cls, data: Mapping[str, str]) -> InstallOptions:
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = data.get(_camel(f.name))
            if raw is None:
                continue
            values[f.name] = raw == "true" if f.type == "bool" else raw
        return cls(**values)


def gang_failure_policy(options: InstallOptions) -> str:
    """The gang webhooks' failurePolicy: the option, else the mode's (placement mode has no
    extender to hold an ungated member, so a member is refused while no allocator answers)."""
    return options.gang_failure_policy or ("Fail" if options.mode == "placement" else "Ignore")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


@dataclass
class ClusterFacts:
    """What the render needs to know of the cluster."""

    foreign: set[tuple[str, str, str, str]] = field(default_factory=set)  # existing, not ours
    tls: TlsFiles | None = None  # generate: the Secrets' files (kept or new)
    dra_served: bool = False  # resource.k8s.io/v1 DeviceClass (Kubernetes >= 1.34)


def repo_root() -> Path:
    """Where the kustomize bases (and charts/) are: the copy an installed wheel carries
    (topoalloc/_manifests, build_bundle.py), else the checkout the package runs from (deploy/ and
    daemonset/ beside topoalloc/)."""
    package = Path(topoalloc.__file__).resolve().parent
    bundled = package / "_manifests"
    return bundled if not missing_bases(bundled) else package.parent


def missing_bases(root: Path) -> list[str]:
    return [b for b in ("deploy", "daemonset") if not (root / b / "kustomization.yaml").is_file()]


def render(options: InstallOptions, facts: ClusterFacts, root: Path | None = None) -> list[Doc]:
    """The objects to apply, in apply order."""
    root = root or repo_root()
    image = (Image("topoalloc", options.image, options.version),)
    components = root / "deploy" / "components"
    extra = ((components / "cert-manager",) if options.certs == "cert-manager" else ()) + (
        (components / "monitoring",) if options.monitoring else ()
    )
    base = root / "deploy" / BASES[options.mode]
    docs = build(base, components=extra, images=image)
    runtime = (
        (root / "deploy" / "components" / "nvidia-runtime-class",) if options.nvidia_runtime_class else ()
    )
    docs += build(root / "daemonset", components=runtime, images=image)
    if options.device_classes and facts.dra_served:
        docs += build(root / "deploy" / "dra")
    docs = _merge_duplicates(docs)
    docs = [d for d in docs if ident(d) not in facts.foreign]
    for doc in docs:
        _adjust(doc, options, facts)
    docs = apply_settings(docs, options.settings())
    if options.certs == "generate" and facts.tls is not None:
        docs += [secret_manifest(name, NAMESPACE, files) for name, files in facts.tls.items()]
    docs.append(record_configmap(options))
    for doc in docs:
        labels = doc.setdefault("metadata", {}).setdefault("labels", {}) or {}
        labels.update({MANAGED_BY: MANAGER, PART_OF: "topoalloc"})
        doc["metadata"]["labels"] = labels
    return sorted(docs, key=_order)


def record_configmap(options: InstallOptions) -> Doc:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": RECORD, "namespace": NAMESPACE},
        "data": options.record(),
    }


def _order(doc: Doc) -> int:
    kind = doc.get("kind", "")
    return KIND_ORDER.index(kind) if kind in KIND_ORDER else KIND_ORDER.index("PodDisruptionBudget")


def _merge_duplicates(docs: Iterable[Doc]) -> list[Doc]:
    """The namespace both bases declare, once, with the labels of both."""
    out: dict[tuple[str, str, str, str], Doc] = {}
    for doc in docs:
        key = ident(doc)
        if key in out:
            labels = out[key].setdefault("metadata", {}).setdefault("labels", {})
            labels.update((doc.get("metadata") or {}).get("labels") or {})
        else:
            out[key] = copy.deepcopy(doc)
    return list(out.values())


def _adjust(doc: Doc, options: InstallOptions, facts: ClusterFacts) -> None:
    kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name")
    if kind == "Deployment" and name == SCHEDULER and options.scheduler_version:
        for container in doc["spec"]["template"]["spec"]["containers"]:
            if container["name"] == "kube-scheduler":
                container["image"] = f"{options.scheduler_image}:{options.scheduler_version}"
    if kind == "MutatingWebhookConfiguration" and name == WEBHOOK_CONFIGURATION:
        ca = (facts.tls or {}).get("topoalloc-allocator-tls", {}).get("ca.crt")
        for hook in doc["webhooks"]:
            if hook["name"] in GANG_WEBHOOKS:
                hook["failurePolicy"] = gang_failure_policy(options)
            if ca and options.certs == "generate":
                # The leader keeps it equal to its Secret's ca.crt; set now, the webhook works at once.
                hook["clientConfig"]["caBundle"] = base64.b64encode(ca).decode()


def kinds(root: Path | None = None) -> list[tuple[str, str]]:
    """(apiVersion, kind) of everything any installation may create, in reverse apply order:
    what uninstall and prune look for."""
    seen: dict[tuple[str, str], int] = {}
    for mode in MODES:
        for certs in CERTS:
            options = InstallOptions("0", mode=mode, certs=certs, scheduler_version="v1.0.0", monitoring=True)
            tls = {"topoalloc-allocator-tls": {}, "topoalloc-scheduler-client": {}}
            for doc in render(options, ClusterFacts(tls=tls, dra_served=True), root):  # type: ignore[arg-type]
                seen.setdefault((doc["apiVersion"], doc["kind"]), _order(doc))
    return sorted(seen, key=lambda k: -seen[k])
