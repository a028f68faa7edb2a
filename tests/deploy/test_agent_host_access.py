"""The agent's DaemonSet reaches no more of its node than the agent's code opens: its hostPath
volumes are exactly agent/host_paths.py's table (which the code's defaults come from), each mounted
where the table says, writable only where the agent writes, and the container keeps no capability,
no privilege escalation, no host PID or IPC namespace."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import host_paths
from agent.host_paths import HOST_PATHS
from topoalloc.commands.installer.kustomize import build

REPO = Path(__file__).resolve().parents[2]
TABLE = {h.path: h for h in HOST_PATHS}


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    docs = [d for d in build(REPO / "daemonset") if d]
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    return dict(daemonset["spec"]["template"]["spec"])


@pytest.fixture(scope="module")
def container(spec: dict[str, Any]) -> dict[str, Any]:
    (agent,) = spec["containers"]
    return dict(agent)


def host_volumes(spec: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}


def test_host_paths_are_exactly_those_the_code_opens(spec: dict[str, Any]) -> None:
    assert sorted(host_volumes(spec).values()) == sorted(TABLE)
    others = [v for v in spec["volumes"] if "hostPath" not in v]
    assert [sorted(k for k in v if k != "name") for v in others] == [["configMap"]]


def test_each_mounted_where_the_code_looks_and_written_only_where_it_writes(
    spec: dict[str, Any], container: dict[str, Any]
) -> None:
    volumes = host_volumes(spec)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    for name, path in volumes.items():
        mount, want = mounts[name], TABLE[path]
        assert mount["mountPath"] == want.mount, path
        assert bool(mount.get("readOnly")) is not want.writable, (
            f"{path}: readOnly should be {not want.writable}"
        )
    assert not container.get("volumeDevices")


def test_every_path_the_agent_is_given_lies_in_a_mount(container: dict[str, Any]) -> None:
    """The paths in the container's flags and in its configuration file (cgroups, kubelet's
    configuration) are inside a mount: none names a host path the DaemonSet does not give it."""
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    flags = dict(a.removeprefix("--").split("=", 1) for a in container["args"] if a.startswith("--"))
    config = yaml.safe_load(
        next(d for d in build(REPO / "daemonset") if d and d["kind"] == "ConfigMap")["data"]["agent.yaml"]
    )
    paths = [v for v in flags.values() if v.startswith("/")]
    paths += [config["midTier"]["cgroupRoot"], config["kubelet"]["configFile"]]
    assert len(paths) >= 10
    for path in paths:
        assert any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts), path


def test_the_flags_name_the_tables_paths(container: dict[str, Any]) -> None:
    """Where a flag names a host path, it is the table's (the code's default), or for /sys and /dev
    the table's mount point."""
    flags = dict(a.removeprefix("--").split("=", 1) for a in container["args"] if a.startswith("--"))
    assert flags["sysfs-root"] == host_paths.HOST + host_paths.SYSFS
    assert flags["dev-root"] == host_paths.HOST + host_paths.DEV
    assert flags["device-plugin-dir"] == host_paths.DEVICE_PLUGINS
    assert flags["pod-resources-socket"] == host_paths.POD_RESOURCES_SOCKET
    assert flags["state-dir"] == host_paths.STATE
    assert flags["dra-registry-dir"] == host_paths.DRA_REGISTRY
    assert flags["dra-plugin-dir"] == host_paths.DRA_PLUGIN
    assert flags["dra-cdi-root"] == host_paths.CDI_DYNAMIC


def test_every_path_of_the_table_is_used_by_the_code() -> None:
    """A path in the table that no code of the agent uses would be a mount nobody needs."""
    sources = [
        p for p in (REPO / "agent").rglob("*.py") if p.name != "host_paths.py" and "proto" not in p.parts
    ]
    sources.append(REPO / "topoalloc" / "commands" / "agent.py")
    text = "\n".join(p.read_text() for p in sources)
    names = [
        n
        for n, v in vars(host_paths).items()
        if isinstance(v, str) and n.isupper() and v.startswith("/") and n != "HOST"
    ]
    unused = [n for n in names if not re.search(rf"host_paths\.{n}\b", text)]
    # the folders whose files the code names (POD_RESOURCES_SOCKET, UDEV_CONTROL) count through them
    assert set(unused) <= {"POD_RESOURCES", "UDEV_RUN"}, unused


def test_no_privilege_beyond_the_mounts(spec: dict[str, Any], container: dict[str, Any]) -> None:
    context = container["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert not context.get("privileged")
    assert not spec.get("hostPID") and not spec.get("hostIPC")
    # hostNetwork only because the kernel delivers uevents (hot-plug) per network namespace
    assert spec["hostNetwork"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
