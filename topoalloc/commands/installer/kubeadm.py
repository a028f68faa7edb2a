"""`install --mode kubeadm`: the files a self-managed control plane's own kube-scheduler needs.

kube-scheduler runs as a static pod with the host's DNS, which cannot resolve Service names, so
its extender URL is the allocator Service's ClusterIP (read from the cluster, not pasted by hand)
and TLS checks the certificate against the Service DNS name (`serverName`). The files:

* `kube-scheduler-config.yaml`: deploy/kube-scheduler/kube-scheduler-config.yaml with the ClusterIP;
* `ca.crt`, `client.crt`, `client.key`: from the Secret topoalloc-scheduler-client;
* `patches/kube-scheduler+json.json`: a kubeadm patch (`kubeadm init|join|upgrade ... --patches`)
  that starts kube-scheduler with that config and mounts /etc/kubernetes/topoalloc.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

HOST_DIR = "/etc/kubernetes/topoalloc"
CONFIG = "kube-scheduler-config.yaml"
PATCH = "patches/kube-scheduler+json.json"
PLACEHOLDER = "ALLOCATOR_CLUSTER_IP"


def scheduler_config(root: Path, cluster_ip: str) -> str:
    """The KubeSchedulerConfiguration with the allocator's ClusterIP in its extender URL."""
    text = (root / "deploy" / "kube-scheduler" / CONFIG).read_text()
    host = f"[{cluster_ip}]" if ":" in cluster_ip else cluster_ip
    return text.replace(f"https://{PLACEHOLDER}:", f"https://{host}:")


def kubeadm_patch() -> list[dict[str, object]]:
    """JSON 6902 operations on kubeadm's kube-scheduler static pod."""
    return [
        {"op": "add", "path": "/spec/containers/0/command/-", "value": f"--config={HOST_DIR}/{CONFIG}"},
        {
            "op": "add",
            "path": "/spec/volumes/-",
            "value": {"name": "topoalloc", "hostPath": {"path": HOST_DIR, "type": "Directory"}},
        },
        {
            "op": "add",
            "path": "/spec/containers/0/volumeMounts/-",
            "value": {"name": "topoalloc", "mountPath": HOST_DIR, "readOnly": True},
        },
    ]


def files(root: Path, cluster_ip: str, client: Mapping[str, bytes]) -> dict[str, bytes]:
    return {
        CONFIG: scheduler_config(root, cluster_ip).encode(),
        "ca.crt": client["ca.crt"],
        "client.crt": client["tls.crt"],
        "client.key": client["tls.key"],
        PATCH: (json.dumps(kubeadm_patch(), indent=2) + "\n").encode(),
    }


def write(folder: Path, contents: Mapping[str, bytes]) -> list[Path]:
    written = []
    for name, data in contents.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, 0o600 if name.endswith(".key") else 0o644)
        written.append(path)
    return written


def instructions(folder: Path) -> list[str]:
    return [
        f"kube-scheduler files in {folder}/ (the extender block: {folder / CONFIG});",
        "on every control-plane node:",
        f"  1. copy them to {HOST_DIR}/ (client.key readable by root only)",
        f"  2. kubeadm upgrade node --patches {HOST_DIR}/patches",
        f"     (or add --config={HOST_DIR}/{CONFIG} and a hostPath mount of {HOST_DIR}",
        "     to /etc/kubernetes/manifests/kube-scheduler.yaml by hand)",
        "  kube-scheduler then calls the allocator for every pod that asks for a GPU or RDMA device",
    ]


def wired_schedulers(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """The kube-scheduler pods (kube-system, component=kube-scheduler: kubeadm's static pods as
    their mirror pods show them) started with topoalloc's configuration or mounting its folder."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("namespace") != "kube-system" or (meta.get("labels") or {}).get("component") != (
            "kube-scheduler"
        ):
            continue
        spec = pod.get("spec") or {}
        words = [str(w) for c in spec.get("containers") or [] for w in (c.get("command") or [])]
        words += [str((v.get("hostPath") or {}).get("path", "")) for v in spec.get("volumes") or []]
        if any(HOST_DIR in w for w in words):
            out.append(str(meta.get("name", "")))
    return sorted(out)


def extender_block(root: Path, cluster_ip: str) -> list[str]:
    """The extender entry `install --mode kubeadm` wrote (YAML lines, as under `extenders:`)."""
    import yaml

    config = yaml.safe_load(scheduler_config(root, cluster_ip or PLACEHOLDER))
    text = yaml.safe_dump(config["extenders"], sort_keys=False, default_flow_style=None, width=200)
    return text.splitlines()


def undo_instructions(root: Path, cluster_ip: str, schedulers: Iterable[str] = ()) -> list[str]:
    """What to undo on each control-plane node once the allocator is gone: kube-scheduler still
    calls it (`ignorable: false`), so every pod asking for a device it manages fails to schedule."""
    url = f"https://{cluster_ip or PLACEHOLDER}:8443"
    running = ", ".join(schedulers)
    return [
        "kube-scheduler on the control plane still calls the allocator (install --mode kubeadm"
        + (f"; running with its configuration: {running}" if running else "")
        + "): with the allocator gone and ignorable: false, every pod asking for a GPU or RDMA device "
        "fails to schedule. On every control-plane node:",
        f"  1. /etc/kubernetes/manifests/kube-scheduler.yaml: remove --config={HOST_DIR}/{CONFIG} from "
        f"the command and the volume and volumeMount named topoalloc (hostPath {HOST_DIR}); kubelet "
        "restarts kube-scheduler when the file changes",
        f"     (if you merged {HOST_DIR}/{CONFIG} into your own KubeSchedulerConfiguration instead: remove "
        f"the extender with urlPrefix {url} from its extenders, then restart kube-scheduler)",
        f"  2. leave {HOST_DIR}/patches out of kubeadm's --patches, so kubeadm upgrade does not put it back",
        f"  3. rm -r {HOST_DIR}",
        "  4. check: topoalloc doctor (it fails while a kube-scheduler still runs with it)",
        f"  the extender block to remove ({HOST_DIR}/{CONFIG}, under extenders:):",
        *(f"    {line}" for line in extender_block(root, cluster_ip)),
    ]
