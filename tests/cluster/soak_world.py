"""The soak's world on a running tier cluster (tests/cluster/harness.py `ClusterEnv`): device plugin
nodes (the real agent serving a stand-in kubelet, tests/cluster/burst.py) and DRA nodes (the real
agent's DRA plugin and the stand-in DRA kubelet, tests/cluster/dra.py), each agent taking fixture
events (a GPU turning unhealthy, back after `XID_HOLD` seconds); two allocator replicas with
defragmentation on; priority classes; the soak's namespace with its claim templates. `snapshot()`
reads what the invariants need (tests/soak/invariants.py). No pytest here: bench/soak.py runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from apis import dra
from tests.cluster.burst import PLUGIN_RESOURCES, PluginNode, start_plugin_node, stop_plugin_nodes
from tests.cluster.dra import DraNode, start_dra_node, stop_dra_node, wait_slices
from tests.cluster.dra_claims import create_template, gpu_template
from tests.cluster.harness import ALLOCATED, DEVICES, ClusterEnv
from tests.cluster.soak_kubelets import SoakKubelets, finished, key_of
from tests.soak.invariants import WHOLE, ClaimView, GangView, PodView, ReservationView, Snapshot
from tests.support.controlplane import ApiStatus

JSON = dict[str, Any]
NS = "soak"
POOL = {"topoalloc.soak/pool": "plugin"}
RESERVATIONS = "/apis/scheduling.koordinator.sh/v1alpha1/reservations"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
PRIORITIES = {"soak-low": 10, "soak-mid": 100, "soak-high": 1000}
XID_HOLD = 20  # seconds a GPU stays unhealthy after an Xid (agent config health.xidHoldSeconds)
IDENTITIES = ("alloc-a", "alloc-b")
CORE = "koordinator.sh/gpu-core"
LATENCY = "topoalloc_extender_request_duration_seconds_bucket"


@dataclass
class SoakWorld:
    cluster: ClusterEnv
    plugin_count: int = 3
    dra_count: int = 1
    plugin_nodes: list[PluginNode] = field(default_factory=list)
    dra_nodes: list[DraNode] = field(default_factory=list)
    inboxes: dict[str, Path] = field(default_factory=dict)
    kubelets: SoakKubelets | None = None
    uuids: dict[str, dict[int, str]] = field(default_factory=dict)  # node -> minor -> GPU UUID
    rss: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    p99: list[tuple[float, float]] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)
    _buckets: dict[str, tuple[int, dict[float, float]]] = field(default_factory=dict)
    _window: dict[float, float] = field(default_factory=dict)
    _log_offsets: dict[Path, int] = field(default_factory=dict)

    def clock(self) -> float:
        return time.monotonic() - self.t0

    # -- set-up -------------------------------------------------------------------------------------

    @property
    def allocator_args(self) -> tuple[str, ...]:
        config = {
            "defrag": {"enabled": True, "dryRun": False, "interval": 5, "minWait": 15, "allowBarePods": True}
        }
        path = self.cluster.workdir / "soak-allocator.yaml"
        path.write_text(yaml.safe_dump(config))
        return (*self.cluster.allocator_args(), "--config", str(path))

    def start_allocator(self, identity: str) -> None:
        self.cluster.start_allocator(identity, extra_args=self.allocator_args)

    def start(self) -> None:
        cp = self.cluster.cp
        for name, value in PRIORITIES.items():
            with contextlib.suppress(ApiStatus):  # a second soak on the same cluster
                cp.admin.post(
                    "/apis/scheduling.k8s.io/v1/priorityclasses", {"metadata": {"name": name}, "value": value}
                )
        for identity in IDENTITIES:
            self.start_allocator(identity)
        for identity in IDENTITIES:
            self.cluster.replicas[identity].wait_ready()
        agent_config = self.cluster.workdir / "soak-agent.yaml"
        agent_config.write_text(yaml.safe_dump({"health": {"xidHoldSeconds": XID_HOLD}}))
        for i in range(self.plugin_count):
            name = f"soak-p{i}"
            inbox = self.inboxes[name] = self.cluster.workdir / f"{name}-events"
            more = ("--config", str(agent_config), "--fixture-events", str(inbox))
            self.plugin_nodes.append(start_plugin_node(self.cluster, name, labels=POOL, extra_args=more))
        self.dra_nodes = [start_dra_node(self.cluster, f"soak-d{i}") for i in range(self.dra_count)]
        for node in self.plugin_nodes:
            self.cluster.wait_device(node.name, timeout=180)
            node.kubelet.wait_registered(PLUGIN_RESOURCES, timeout=180)
            device = cp.admin.get(f"{DEVICES}/{node.name}")
            self.uuids[node.name] = {
                int(d["minor"]): str(d["id"]) for d in device["spec"]["devices"] if d["type"] == "gpu"
            }
        for node in self.dra_nodes:
            wait_slices(self.cluster, node, timeout=180)
            node.kubelet.wait_registered(dra.DRIVER, timeout=120)
        cp.create_namespace(NS)
        for count in (1, 2):
            create_template(self.cluster, gpu_template(f"gpu{count}", count, NS))
        plugin = {n.name: n.kubelet for n in self.plugin_nodes}
        self.kubelets = SoakKubelets(cp, NS, plugin, {n.name: n.kubelet for n in self.dra_nodes}).start()
        self.t0 = time.monotonic()

    def stop(self) -> None:
        if self.kubelets is not None:
            self.kubelets.close()
        with contextlib.suppress(Exception):
            self.cluster.delete_pods(NS)
        with contextlib.suppress(Exception):
            self.cluster.cp.admin.delete(f"/api/v1/namespaces/{NS}")
        with contextlib.suppress(Exception):
            self.cluster.cp.admin.request(
                "DELETE", RESERVATIONS, query={"labelSelector": "topoalloc.soak/run"}
            )
        stop_plugin_nodes(self.cluster, self.plugin_nodes)
        for node in self.dra_nodes:
            stop_dra_node(self.cluster, node)
        # the tier's own allocator again: one replica, no defragmentation
        follower = self.cluster.replicas.pop("alloc-b", None)
        if follower is not None:
            follower.process.stop()
        self.cluster.start_allocator("alloc-a", extra_args=self.cluster.allocator_args()).wait_ready()

    # -- what the invariants read -------------------------------------------------------------------

    def processes(self) -> dict[str, Any]:
        """name -> Process of every allocator replica and agent."""
        procs = {f"allocator-{i}": r.process for i, r in self.cluster.replicas.items()}
        procs.update({f"agent-{n.name}": n.agent for n in self.plugin_nodes})
        procs.update({f"agent-{n.name}": n.agent for n in self.dra_nodes if n.agent is not None})
        return procs

    def sample_rss(self) -> None:
        now = self.clock()
        for name, proc in self.processes().items():
            if proc.alive():
                with contextlib.suppress(psutil.Error):
                    rss = psutil.Process(proc.pid).memory_info().rss
                    self.rss.setdefault(f"{name}#{proc.pid}", []).append((now, float(rss)))

    def max_rss(self, prefix: str) -> float:
        return max((y for k, s in self.rss.items() if k.startswith(prefix) for _, y in s), default=0.0)

    def sample_latency(self, min_count: int = 30) -> None:
        """The decisions since the last sample (every replica's histogram, restarts included), as a
        p99 once the window holds `min_count` of them."""
        for identity, replica in list(self.cluster.replicas.items()):
            if not replica.process.alive():
                continue
            try:
                status, text = replica.health("/metrics")
            except Exception:
                continue
            if status != 200:
                continue
            now: dict[float, float] = {}
            for line in text.splitlines():
                if line.startswith(LATENCY):
                    le = re.search(r'le="([^"]+)"', line)
                    if le:
                        bound = float(le.group(1))
                        now[bound] = now.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
            pid, before = self._buckets.get(identity, (0, {}))
            if pid != replica.process.pid:
                before = {}
            for bound, count in now.items():
                self._window[bound] = self._window.get(bound, 0.0) + count - before.get(bound, 0.0)
            self._buckets[identity] = (replica.process.pid, now)
        total = self._window.get(float("inf"), 0.0)
        if total >= min_count:
            target = 0.99 * total
            p99 = next(b for b in sorted(self._window) if self._window[b] >= target)
            self.p99.append((self.clock(), p99))
            self._window = {}

    def new_log_lines(self) -> list[tuple[str, str]]:
        out = []
        for name, proc in self.processes().items():
            path = proc.log
            with contextlib.suppress(OSError):
                size = os.path.getsize(path)
                start = self._log_offsets.get(path, 0)
                if size > start:
                    with open(path, "rb") as f:
                        f.seek(start)
                        chunk = f.read(size - start)
                    cut = chunk.rfind(b"\n") + 1
                    self._log_offsets[path] = start + cut
                    out += [(name, line) for line in chunk[:cut].decode(errors="replace").splitlines()]
        return out

    def pod_view(
        self, pod: JSON, events: set[str], gangs: dict[str, str], created: dict[str, float]
    ) -> PodView:
        meta, spec = pod["metadata"], pod["spec"]
        key = key_of(pod)
        node = spec.get("nodeName") or ""
        raw = (meta.get("annotations") or {}).get(ALLOCATED)
        gpus: dict[str, int] = {}
        vfs: list[str] = []
        if raw and node in self.uuids:
            record = json.loads(raw)
            for g in record.get("gpu") or []:
                share = int(str((g.get("resources") or {}).get(CORE, WHOLE)))
                gpus[self.uuids[node][int(g["minor"])]] = share
            for nic in record.get("rdma") or []:  # its VFs, or the PF itself where it names none
                vfs += [vf["busID"] for vf in (nic.get("extension") or {}).get("vfs") or []] or [nic["id"]]
        conditions = (pod.get("status") or {}).get("conditions") or []
        explained = meta["name"] in events or any(
            c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("message")
            for c in conditions
        )
        return PodView(
            key,
            created=created.get(key, 0.0),
            node=node,
            gates=tuple(g["name"] for g in spec.get("schedulingGates") or []),
            finished=finished(pod),
            deleting=bool(meta.get("deletionTimestamp")),
            gang=gangs.get(key, ""),
            gpus=gpus,
            vfs=tuple(vfs),
            explained=explained,
        )

    def snapshot(
        self,
        last_fault: float,
        gangs: dict[str, GangView],
        created: dict[str, float],
        expiries: dict[str, float],
        log_lines: Callable[[], list[tuple[str, str]]] | None = None,
    ) -> tuple[Snapshot, JSON]:
        """The snapshot, and the raw objects it was read from (for a reproduction record)."""
        assert self.kubelets is not None
        with self.kubelets.lock:  # what was served first, then the pods: a pod gone since is not live
            served = dict(self.kubelets.served)
            errors = dict(self.kubelets.errors)
        prepared = self.kubelets.prepared_devices()
        admin = self.cluster.cp.admin
        pods = admin.get(f"/api/v1/namespaces/{NS}/pods")["items"]
        events = {
            e["involvedObject"].get("name", "") for e in admin.get(f"/api/v1/namespaces/{NS}/events")["items"]
        }
        claims = admin.get(CLAIMS)["items"]
        reservations = admin.get(RESERVATIONS, labelSelector="topoalloc.soak/run")["items"]
        member_of = {m: g.key for g in gangs.values() for m in g.members}
        views = {key_of(p): self.pod_view(p, events, member_of, created) for p in pods}
        live_uids = {p["metadata"]["uid"] for p in pods if not finished(p)}
        claim_views: dict[str, ClaimView] = {}
        by_pod: dict[str, list[ClaimView]] = {}
        for c in claims:
            key = f"{NS}/{c['metadata']['name']}"
            allocation = (c.get("status") or {}).get("allocation") or {}
            results = (allocation.get("devices") or {}).get("results") or []
            terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or [{}]
            fields = terms[0].get("matchFields") or [{}]
            owners = {o.get("uid") for o in c["metadata"].get("ownerReferences") or []}
            reserved = {r.get("uid") for r in (c.get("status") or {}).get("reservedFor") or []}
            view = ClaimView(
                key,
                node=str((fields[0].get("values") or [""])[0]),
                allocated=tuple(f"{r['pool']}/{r['device']}" for r in results),
                prepared=prepared.get(key),
                live=bool((owners | reserved) & live_uids),
            )
            claim_views[key] = view
            for o in c["metadata"].get("ownerReferences") or []:
                by_pod.setdefault(f"{NS}/{o.get('name')}", []).append(view)
        for key, pod_claims in by_pod.items():
            if key in views:
                views[key].claims = tuple(c.key for c in pod_claims)
                views[key].claims_allocated = all(c.allocated for c in pod_claims)
        resv = {
            r["metadata"]["name"]: ReservationView(
                r["metadata"]["name"],
                (r.get("status") or {}).get("phase", ""),
                expiries.get(r["metadata"]["name"]),
            )
            for r in reservations
        }
        snap = Snapshot(
            now=self.clock(),
            last_fault=last_fault,
            pods=views,
            served=served,
            admission_errors=errors,
            claims=claim_views,
            gangs=gangs,
            reservations=resv,
            rss=self.rss,
            p99=self.p99,
            log_lines=(log_lines or self.new_log_lines)(),
        )
        return snap, {"pods": pods, "claims": claims, "reservations": reservations}
