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
from collections.abc import Mapping
from pathlib import Path

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
