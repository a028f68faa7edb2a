"""The soak's kubelets: one loop playing every node's kubelet for the soak's namespace. No pytest.

Every second it lists the namespace's pods and, as kubelet would: admits each pod newly bound to a
device plugin node through that node's stand-in kubelet (GetPreferredAllocation + Allocate, the
real agent answering), prepares the claims of each pod bound to a DRA node through the stand-in DRA
kubelet (NodePrepareResources), frees what a finished or deleted pod held (unprepares its claims),
and finishes deleting a pod that is terminating (grace 0: no containers to stop); an unprepare that
fails (the agent down) is retried on each pass, as kubelet retries it. A refusal is kept
(`errors`) and retried on the next pass, as a pod recreated by its controller would be. What Allocate
served each pod is kept as the invariants read it (tests/soak/invariants.py `Served`).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from tests.soak.invariants import WHOLE, Served
from tests.support.controlplane import ApiStatus, ControlPlane
from tests.support.dra_kubelet import DraKubelet
from tests.support.kubelet import AdmissionError, Granted, StandInKubelet

JSON = dict[str, Any]


def served_devices(granted: dict[str, dict[str, Granted]]) -> tuple[dict[str, int], tuple[str, ...]]:
    """GPU UUID -> share, and VF addresses, that Allocate's answers hand the pod's containers."""
    gpus: dict[str, int] = {}
    vfs: list[str] = []
    for resources in granted.values():
        for g in resources.values():
            visible = g.envs.get("NVIDIA_VISIBLE_DEVICES", "")
            share = int(g.envs.get("CUDA_DEVICE_SM_LIMIT", WHOLE))
            for uuid in filter(None, visible.split(",")):
                gpus[uuid] = share
            vfs += filter(None, g.envs.get("PCIDEVICE_KOORDINATOR_SH_RDMA", "").split(","))
    return gpus, tuple(vfs)


def key_of(pod: JSON) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def finished(pod: JSON) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class SoakKubelets:
    def __init__(
        self,
        cp: ControlPlane,
        ns: str,
        plugin: dict[str, StandInKubelet],
        dra: dict[str, DraKubelet],
        interval: float = 1.0,
    ) -> None:
        self.cp, self.ns, self.plugin, self.dra, self.interval = cp, ns, plugin, dra, interval
        self.lock = threading.Lock()
        self.served: dict[str, Served] = {}
        self.prepared: dict[str, JSON] = {}  # pod key -> the pod as prepared (unprepare needs it)
        self.unprepare_pending: dict[str, JSON] = {}  # pods gone whose claims' unprepare failed
        self.errors: dict[str, str] = {}
        self.admitted = 0
        self.terminated = 0  # terminating pods finished (evicted, preempted, deleted)
        self.failed_passes = 0
        self.last_failure = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-kubelets", daemon=True)

    def start(self) -> SoakKubelets:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.one_pass()
            except Exception as exc:  # kube-apiserver restarting, mostly: the next pass retries
                self.failed_passes += 1
                self.last_failure = f"{type(exc).__name__}: {exc}"

    def one_pass(self) -> None:
        pods = self.cp.admin.get(f"/api/v1/namespaces/{self.ns}/pods")["items"]
        seen = set()
        for pod in pods:
            key = key_of(pod)
            seen.add(key)
            node = pod["spec"].get("nodeName") or ""
            if pod["metadata"].get("deletionTimestamp"):
                self._free(key)
                with contextlib.suppress(ApiStatus):
                    name = pod["metadata"]["name"]
                    self.cp.admin.delete(f"/api/v1/namespaces/{self.ns}/pods/{name}", gracePeriodSeconds=0)
                    self.terminated += 1
            elif finished(pod):
                self._free(key)
            elif node in self.plugin and key not in self.served:
                self._admit(self.plugin[node], node, key, pod)
            elif node in self.dra and key not in self.prepared and pod["spec"].get("resourceClaims"):
                self._prepare(self.dra[node], key, pod)
        for key in (set(self.served) | set(self.prepared) | set(self.errors)) - seen:
            self._free(key)
        for key, gone in list(self.unprepare_pending.items()):
            self._unprepare(key, gone)

    def _admit(self, kubelet: StandInKubelet, node: str, key: str, pod: JSON) -> None:
        try:
            granted = kubelet.admit(pod)
        except AdmissionError as exc:
            with self.lock:
                self.errors[key] = f"{node}: {exc}"
            return
        gpus, vfs = served_devices(granted)
        with self.lock:
            self.served[key] = Served(key, node, gpus, vfs)
            self.errors.pop(key, None)
            self.admitted += 1

    def _prepare(self, kubelet: DraKubelet, key: str, pod: JSON) -> None:
        try:
            kubelet.prepare(pod)
        except Exception as exc:  # PrepareError, or the plugin's socket gone with its agent
            with self.lock:
                self.errors[key] = f"{pod['spec']['nodeName']}: {exc}"
            return
        with self.lock:
            self.prepared[key] = pod
            self.errors.pop(key, None)
            self.admitted += 1

    def _free(self, key: str) -> None:
        ns, name = key.split("/", 1)
        with self.lock:
            served = self.served.pop(key, None)
            pod = self.prepared.pop(key, None)
            self.errors.pop(key, None)
        if served is not None:
            self.plugin[served.node].release(ns, name)
        if pod is not None:
            self._unprepare(key, pod)

    def _unprepare(self, key: str, pod: JSON) -> None:
        """Like kubelet, retried on each pass until the plugin answers (its agent may be down)."""
        try:
            self.dra[pod["spec"]["nodeName"]].unprepare(pod)
        except Exception as exc:  # PrepareError, or the plugin's socket gone with its agent
            with self.lock:
                self.unprepare_pending[key] = pod
                self.last_failure = f"unprepare {key}: {type(exc).__name__}: {exc}"
            return
        with self.lock:
            self.unprepare_pending.pop(key, None)

    def prepared_devices(self) -> dict[str, tuple[str, ...]]:
        """namespace/claim -> pool/device of each device the DRA plugins prepared for it."""
        out: dict[str, tuple[str, ...]] = {}
        for kubelet in self.dra.values():
            for (ns, name), info in list(kubelet.cache.items()):
                if info.prepared:
                    devices = [f"{d.pool}/{d.device}" for ds in info.devices.values() for d in ds]
                    out[f"{ns}/{name}"] = tuple(devices)
        return out
