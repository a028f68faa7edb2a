"""daemonset/: the manifests parse and fit together, the ClusterRole grants exactly what the agent
uses against the fake API server, and the ValidatingAdmissionPolicy's CEL (evaluated with
cel-python) confines the agent to its own node."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from agent.config import load_config
from agent.fixtures.loader import Fixture
from agent.kube import Kube
from agent.main_loop import Agent
from tests.agent.deviceplugin.rig import exercise_device_plugins
from tests.agent.dra.rig import exercise_dra
from tests.agent.support import FIXTURES, REPO

DIR = REPO / "daemonset"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DIR / name).read_text()) if d]


def _all() -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(DIR.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            for doc in _docs(path.name):
                out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


def test_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((DIR / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(
        p.name for p in DIR.glob("*.yaml") if p.name != "kustomization.yaml"
    )
    assert (REPO / "Containerfile").read_text().count("ENTRYPOINT") == 1


def test_daemonset_wiring(tmp_path: Path) -> None:
    objs = _all()
    ds = objs["DaemonSet/topoalloc-agent"]
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["hostNetwork"] is True  # uevents are per network namespace
    assert pod["serviceAccountName"] in {
        o["metadata"]["name"] for o in objs.values() if o["kind"] == "ServiceAccount"
    }
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for host in ("/sys", "/dev", "/run/udev"):
        mount = next(
            m for m in c["volumeMounts"] if volumes[m["name"]].get("hostPath", {}).get("path") == host
        )
        assert mount["readOnly"] is True, host
    assert "--sysfs-root=/host/sys" in c["args"] and mounts["/host/sys"]["readOnly"]
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert pod["tolerations"] and pod["affinity"]["nodeAffinity"]
    # the probes hit the port the agent's config listens on
    cm = objs["ConfigMap/topoalloc-agent"]
    config_path = tmp_path / "agent.yaml"
    config_path.write_text(cm["data"]["agent.yaml"])
    cfg = load_config(config_path)  # the shipped config is valid
    assert c["livenessProbe"]["httpGet"]["port"] == cfg.health_port == c["readinessProbe"]["httpGet"]["port"]
    assert (
        c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    )
    cfg_mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    assert f"--config={cfg_mount['mountPath']}/agent.yaml" in c["args"]
    assert cfg.mid_tier.cgroup_root.startswith(mounts["/host/sys"]["mountPath"])
    # the device plugins: every path flag points into a mount of the same host path
    flags = dict(a.removeprefix("--").split("=", 1) for a in c["args"] if a.startswith("--") and "=" in a)
    host_of = {m["mountPath"]: volumes[m["name"]].get("hostPath", {}).get("path") for m in c["volumeMounts"]}
    assert host_of[flags["device-plugin-dir"]] == "/var/lib/kubelet/device-plugins"
    assert not mounts[flags["device-plugin-dir"]].get("readOnly")  # the plugin sockets are created there
    pr_dir = str(Path(flags["pod-resources-socket"]).parent)
    assert host_of[pr_dir] == "/var/lib/kubelet/pod-resources" and mounts[pr_dir]["readOnly"]
    assert host_of[flags["dev-root"]] == "/dev"
    assert host_of[flags["state-dir"]] == flags["state-dir"] and not mounts[flags["state-dir"]].get(
        "readOnly"
    )
    for cdi in ("/etc/cdi", "/var/run/cdi"):  # the default CDI roots, at the host's paths
        assert host_of[cdi] == cdi
    assert mounts["/etc/cdi"]["readOnly"]
    # the DRA plugin: its sockets where kubelet looks (at the host's paths: kubelet dials the DRA
    # socket by the path the agent names), and its claims' CDI specs in a writable CDI root
    assert (
        host_of[flags["dra-registry-dir"]] == flags["dra-registry-dir"] == "/var/lib/kubelet/plugins_registry"
    )
    assert (
        host_of[flags["dra-plugin-dir"]] == flags["dra-plugin-dir"] == "/var/lib/kubelet/plugins/topoalloc.io"
    )
    assert host_of[flags["dra-cdi-root"]] == flags["dra-cdi-root"] == "/var/run/cdi"
    for flag in ("dra-registry-dir", "dra-plugin-dir", "dra-cdi-root"):
        assert not mounts[flags[flag]].get("readOnly"), flag
    assert cfg.mode == "device-plugin"  # the shipped default; dra is one line away
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


# -- RBAC: exactly what the agent uses -------------------------------------------------------------
_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)(?:/namespaces/[^/]+)?/(?P<resource>[a-z]+)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?$"
)


def _verb(method: str, has_name: bool, query: dict[str, str]) -> str:
    if method == "GET":
        return ("watch" if query.get("watch") in ("true", "1") else "list") if not has_name else "get"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]


def _wait_closed(server, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.watch_count("pods") == 0:
            return True
        time.sleep(0.02)
    return False


def _allowed(rules: list[dict], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def test_cluster_role_grants_exactly_what_the_agent_uses(
    fake_api_thread, fake_api_sync_client, tmp_path
) -> None:
    server = fake_api_thread
    node = "rbac-node"
    server.put(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node},
            "status": {
                "capacity": {"cpu": "8", "memory": "8Gi"},
                "allocatable": {"cpu": "8", "memory": "8Gi"},
            },
        }
    )
    fx = Fixture.load(FIXTURES / "dgx-h100")
    agent = Agent(
        node_name=node,
        nvml=fx.nvml,
        sysfs_root=fx.sys_root,
        config=load_config(None),
        kube=Kube(fake_api_sync_client),
    )
    agent.config.mid_tier.cgroup_root = str(tmp_path)
    try:
        agent.run_once()  # creates the Device, patches the Node, starts the pod watch
        assert agent.pods.started and agent.pods.synced.wait(5)
        server.wait_for_watches_blocking(1, "pods")
        fx.nvml.lose(0)
        agent.run_once()  # updates spec and status
    finally:
        agent.shutdown()  # ends the pod watch: the fake logs a watch when its stream closes
    assert _wait_closed(server)
    exercise_device_plugins(server, fake_api_sync_client)  # refusal Event, pod list, annotation fix
    exercise_dra(server, fake_api_sync_client)  # slices listed, written, deleted; a claim read
    used = set()
    for r in server.requests():
        if r.path == "/version":
            continue  # readable by every client (the built-in role system:public-info-viewer)
        m = _PATH.match(r.path)
        assert m, r.path
        resource = m["resource"] + (f"/{m['sub']}" if m["sub"] else "")
        used.add((m["group"] or "", resource, _verb(r.method, bool(m["name"]), r.query)))
    rules = next(d for d in _docs("rbac.yaml") if d["kind"] == "ClusterRole")["rules"]
    for group, resource, verb in used:
        assert _allowed(rules, group, resource, verb), (group, resource, verb)
    granted = {
        (g, res, v) for r in rules for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]
    }
    assert granted == used, f"granted but never used: {granted - used}"
    assert not any("*" in str(r) for r in rules)


# -- the admission policy ---------------------------------------------------------------------------
POLICY = next(d for d in _docs("admission-policy.yaml") if d["kind"] == "ValidatingAdmissionPolicy")
SA = "system:serviceaccount:topoalloc-system:topoalloc-agent"
_ENV = celpy.Environment()


def _eval(expr: str, activation: dict[str, Any], variables: dict[str, Any] | None = None) -> Any:
    cel = celpy.json_to_cel(activation)
    if variables is not None:  # already CEL values: json_to_cel would turn their bools into ints
        cel["variables"] = celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()}
        )
    result = _ENV.program(_ENV.compile(expr)).evaluate(cel)
    # kube-apiserver refuses the request with the error instead of the policy's message: never OK.
    assert not isinstance(result, celpy.CELEvalError), f"{expr!r} failed to evaluate: {result}"
    return result


def _admit(
    *, user: str = SA, node: str | None = "a", resource: str, sub: str = "", obj: Any, old: Any
) -> list[str]:
    """The messages of the failed validations (empty: admitted) for one admission request.

    Shaped as kube-apiserver shapes it (tests/cluster/test_security.py checks the real one): no
    `subResource` key on the main resource, no `extra` when the token carries none."""
    name = (obj or old)["metadata"]["name"]
    request: dict[str, Any] = {
        "userInfo": {"username": user},
        "resource": {"resource": resource},
        "name": name,
        "operation": "CREATE" if old is None else "DELETE" if obj is None else "UPDATE",
    }
    if node:
        request["userInfo"]["extra"] = {"authentication.kubernetes.io/node-name": [node]}
    if sub:
        request["subResource"] = sub
    base = {"request": request, "object": obj, "oldObject": old}
    if not all(_eval(m["expression"], base) for m in POLICY["spec"]["matchConditions"]):
        return []  # not the agent: the policy does not apply
    variables = {}
    for var in POLICY["spec"]["variables"]:
        variables[var["name"]] = _eval(var["expression"], base, variables)
    return [
        v["message" if "message" in v else "messageExpression"]
        for v in POLICY["spec"]["validations"]
        if not _eval(v["expression"], base, variables)
    ]


def _device(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"devices": []}}


def _node(
    name: str = "a", labels: dict | None = None, capacity: dict | None = None, taints: list | None = None
) -> dict:
    return {
        "metadata": {"name": name, "labels": labels or {"kubernetes.io/hostname": name}},
        "spec": {"taints": taints or []},
        "status": {"capacity": capacity or {"cpu": "64"}, "allocatable": capacity or {"cpu": "64"}},
    }


def test_policy_lets_the_agent_write_its_own_device() -> None:
    assert _admit(resource="devices", obj=_device("a"), old=None) == []
    assert _admit(resource="devices", sub="status", obj=_device("a"), old=_device("a")) == []


@pytest.mark.parametrize(
    ("case", "kwargs"),
    [
        ("another node's Device", {"resource": "devices", "obj": _device("b"), "old": None}),
        (
            "a token not bound to a node",
            {"node": None, "resource": "devices", "obj": _device("a"), "old": None},
        ),
        ("another Node", {"resource": "nodes", "obj": _node("b"), "old": _node("b")}),
    ],
)
def test_policy_refuses_other_objects(case: str, kwargs: dict) -> None:
    assert _admit(**kwargs), case


def test_policy_limits_what_changes_on_the_node() -> None:
    gpu = "node.koordinator.sh/gpu-model"
    old = _node(labels={"kubernetes.io/hostname": "a", "team": "x"})
    ok = _node(labels={"kubernetes.io/hostname": "a", "team": "x", gpu: "H100"})
    assert _admit(resource="nodes", obj=ok, old=old) == []
    mode = _node(labels={"kubernetes.io/hostname": "a", "team": "x", "topoalloc.io/device-mode": "dra"})
    assert _admit(resource="nodes", obj=mode, old=old) == []
    other = _node(labels={"kubernetes.io/hostname": "a", "team": "x", "topoalloc.io/other": "x"})
    assert _admit(resource="nodes", obj=other, old=old)
    relabel = _node(labels={"kubernetes.io/hostname": "a", "team": "y"})
    assert _admit(resource="nodes", obj=relabel, old=old)
    dropped = _node(labels={"kubernetes.io/hostname": "a"})
    assert _admit(resource="nodes", obj=dropped, old=old)
    tainted = _node(labels=old["metadata"]["labels"], taints=[{"key": "k", "effect": "NoSchedule"}])
    assert _admit(resource="nodes", obj=tainted, old=old)

    before = _node(capacity={"cpu": "64", "koordinator.sh/rdma": "800"})
    ours = _node(capacity={"cpu": "64", "koordinator.sh/gpu-core": "800", "kubernetes.io/mid-cpu": "1000"})
    assert _admit(resource="nodes", sub="status", obj=ours, old=before) == []
    theirs = _node(capacity={"cpu": "32", "koordinator.sh/rdma": "800"})
    assert _admit(resource="nodes", sub="status", obj=theirs, old=before)
    plugin = _node(capacity={"cpu": "64", "koordinator.sh/rdma": "800", "nvidia.com/gpu": "8"})
    assert _admit(resource="nodes", sub="status", obj=plugin, old=before)


def test_policy_does_not_apply_to_other_users() -> None:
    assert _admit(user="system:node:a", resource="devices", obj=_device("z"), old=None) == []


def _pod(
    node: str = "a", annotations: dict | None = None, labels: dict | None = None, image: str = "x"
) -> dict:
    return {
        "metadata": {"name": "p", "annotations": annotations or {}, "labels": labels or {}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": image}]},
    }


def test_policy_limits_the_agent_to_the_device_annotation_of_its_own_pods() -> None:
    key = "scheduling.koordinator.sh/device-allocated"
    old = _pod(annotations={key: '{"gpu":[{"minor":4}]}', "team": "x"})
    fixed = _pod(annotations={key: '{"gpu":[{"minor":5}]}', "team": "x"})
    assert _admit(resource="pods", obj=fixed, old=old) == []
    added = _pod(annotations={key: '{"gpu":[{"minor":5}]}'})
    assert _admit(resource="pods", obj=added, old=_pod()) == []
    assert _admit(resource="pods", obj=_pod("b", {key: "{}"}), old=_pod("b")), "a pod of another node"
    assert _admit(resource="pods", obj=_pod(annotations={key: "{}", "team": "y"}), old=old), (
        "another annotation"
    )
    assert _admit(resource="pods", obj=_pod(annotations={key: "{}"}), old=old), "an annotation removed"
    node_key = "topoalloc.io/allocated-node"
    chosen = _pod(annotations={key: '{"gpu":[{"minor":5}]}', node_key: "a", "team": "x"})
    assert _admit(resource="pods", obj=chosen, old=old) == [], "the node's own choice"
    moved = _pod(annotations={key: "{}", node_key: "b", "team": "x"})
    assert _admit(resource="pods", obj=chosen, old=moved) == [], "made for another node, now for this one"
    assert _admit(resource="pods", obj=moved, old=old), "allocated-node naming another node"
    assert _admit(resource="pods", obj=_pod(labels={"x": "y"}), old=_pod()), "a label"
    assert _admit(resource="pods", obj=_pod(image="evil"), old=_pod()), "the spec"


def _slice(node: str = "a", driver: str = "topoalloc.io", pool: str | None = None) -> dict:
    return {
        "metadata": {"name": f"{node}-{driver}-0"},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": pool or node, "generation": 1}},
    }


def test_policy_limits_the_agent_to_its_own_nodes_resource_slices() -> None:
    mine = _slice()
    assert _admit(resource="resourceslices", obj=mine, old=None) == []
    assert _admit(resource="resourceslices", obj=mine, old=mine) == []
    assert _admit(resource="resourceslices", obj=None, old=mine) == []
    rule = "the agent may only write ResourceSlices of driver topoalloc.io for its own node and pool"
    for case, obj, old in (
        ("another node's slice", _slice("b"), None),
        ("another driver's slice", _slice(driver="gpu.nvidia.com"), None),
        ("a pool not named after the node", _slice(pool="b"), None),
        ("moving a slice to another node", _slice("b"), mine),
        ("taking over another node's slice", mine, _slice("b")),
        ("deleting another driver's slice", None, _slice(driver="gpu.nvidia.com")),
    ):
        assert _admit(resource="resourceslices", obj=obj, old=old) == [rule], case
    all_nodes = {
        "metadata": {"name": "x"},
        "spec": {"driver": "topoalloc.io", "allNodes": True, "pool": {"name": "a"}},
    }
    assert _admit(resource="resourceslices", obj=all_nodes, old=None) == [rule]
